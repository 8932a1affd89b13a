"""An engine that loads models from a folder (vLLM, SGLang) gets the tiny random-init model saved
to one, in Hugging Face layout (streamrl.models.hf_folder: the same writer as `streamrl export`).

Such a folder is temporary: it goes when the engine closes (`remove`) or, at the latest, when the process exits,
so no actor start leaves a model behind in the temporary directory."""

from __future__ import annotations

import atexit
import shutil
import tempfile

from streamrl.config import Config, LoraConfig
from streamrl.models import hf_folder as hf_folder_lib


def hf_folder(cfg: Config, model, tokenizer) -> str:
    """cfg.model.path when set; otherwise a temporary folder holding `model` and `tokenizer`."""
    if cfg.model.path:
        return cfg.model.path
    folder = tempfile.mkdtemp(prefix="streamrl-model-")
    _made.add(folder)
    hf_folder_lib.save(folder, _base_of(model, cfg.lora), tokenizer)  # with LoRA the base alone
    return folder


_made: set[str] = set()
"""The temporary folders hf_folder made in this process and has not removed yet."""


def remove(folder: str) -> None:
    """Remove `folder` if hf_folder made it (a user's model.path is never touched)."""
    if folder in _made:
        _made.discard(folder)
        shutil.rmtree(folder, ignore_errors=True)


@atexit.register
def _remove_all() -> None:
    for folder in list(_made):
        remove(folder)


def _base_of(model, lora_cfg: LoraConfig):
    """With LoRA, the frozen base alone (the engine takes each version's adapters through its LoRA API):
    a plain tiny Llama holding the base weights (the adapters folded in, a no-op while lora_B is zero)."""
    from streamrl.models import lora

    state = model.state_dict()
    if not lora.has_adapters(state):
        return model
    from streamrl.models.tiny_llama import TinyLlamaForCausalLM

    plain = TinyLlamaForCausalLM(model.config).to(next(iter(state.values())).dtype)
    plain.load_state_dict(lora.merged(state, lora_cfg), strict=True)
    return plain
