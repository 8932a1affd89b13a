"""The `hf` backend (CPU here, any torch device elsewhere): a transformers causal LM, or the tiny default's
plain-torch Llama (`streamrl.models.tiny_llama`), sampled by `streamrl.models.sampling.generate`, shared with evaluation."""

from __future__ import annotations

from typing import Callable

import torch

from streamrl.actors.backends.base import BackendDefaults, Completion
from streamrl.actors.backends.specs import HFOptions, options
from streamrl.comm.weights import assembly
from streamrl.config import Config
from streamrl.models import lora, sampling
from streamrl.models.model import end_token_ids


class HFBackend(BackendDefaults):
    def __init__(self, cfg: Config, model, tokenizer):
        self.cfg = cfg.actors
        device = options(cfg.actors, HFOptions).device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.pad_id = tokenizer.pad_token_id
        self.eos_ids = end_token_ids(model, tokenizer)  # every end token of the model's generation config
        self.end_ids = self.eos_ids
        # What a version replaces: with LoRA the adapters only (the frozen base never changes), else everything.
        self.targets = lora.published(self.model.state_dict())

    def generate(self, prompts: list[list[int]], n: int,
                 between_steps: Callable[[], int] | None = None) -> list[list[Completion]]:
        c = self.cfg
        return sampling.generate(self.model, prompts, n, temperature=c.temperature, top_p=c.top_p,
                                 max_new_tokens=c.max_new_tokens, pad_id=self.pad_id, eos_id=self.eos_ids,
                                 device=self.device, between_steps=between_steps)

    def eval_sampler(self, temperature: float, tokenizer):
        from streamrl import evaluation

        return evaluation.local_sampler(self.model, tokenizer, temperature)  # what `streamrl eval` samples with

    @torch.no_grad()
    def load_weights(self, state: dict) -> None:
        if isinstance(state, assembly.Received):  # every piece straight from the frames it came in: one copy
            state.copy_into(self.targets)
        elif len(self.targets) < len(self.model.state_dict()):  # LoRA: exactly the adapters, nothing of the base
            if set(state) != set(self.targets):
                raise ValueError(f"weights: the version's tensors differ from the model's adapters (missing "
                                 f"{sorted(set(self.targets) - set(state))[:5]}, unexpected {sorted(set(state) - set(self.targets))[:5]})")
            for name, t in state.items():
                self.targets[name].copy_(t)
        else:
            self.model.load_state_dict(state, strict=True)
