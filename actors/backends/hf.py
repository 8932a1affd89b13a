"""transformers `generate` backend (CPU here, any torch device elsewhere)."""

from __future__ import annotations

import torch

from actors.backends import BACKENDS, Completion


@BACKENDS.register("hf")
class HFBackend:
    def __init__(self, cfg, model, tokenizer):
        self.cfg = cfg.actors
        device = cfg.actors.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.pad_id = tokenizer.pad_token_id
        self.eos_id = tokenizer.eos_token_id

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int) -> list[list[Completion]]:
        rows = [p for p in prompts for _ in range(n)]
        width = max(len(p) for p in rows)
        # Left padding keeps every prompt's last token at the same column for batched decoding.
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(rows):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            do_sample=True,
            temperature=self.cfg.temperature,
            top_p=self.cfg.top_p,
            top_k=0,
            max_new_tokens=self.cfg.max_new_tokens,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        seq = out.sequences[:, width:].cpu()  # (B, T)
        logits = torch.stack(out.logits, dim=1).float().cpu() / self.cfg.temperature  # (B, T, V)
        logp = logits.gather(-1, seq[..., None]).squeeze(-1) - logits.logsumexp(-1)  # (B, T)
        completions = [self._completion(seq[i], logp[i]) for i in range(len(rows))]
        return [completions[j * n:(j + 1) * n] for j in range(len(prompts))]

    def _completion(self, tokens: torch.Tensor, logp: torch.Tensor) -> Completion:
        hits = (tokens == self.eos_id).nonzero()
        if len(hits):
            end = int(hits[0]) + 1
            return Completion(tokens[:end].tolist(), logp[:end].tolist(), "stop")
        return Completion(tokens.tolist(), logp.tolist(), "length")

    @torch.no_grad()
    def load_weights(self, state: dict) -> None:
        self.model.load_state_dict(state, strict=True)
