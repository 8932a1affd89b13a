"""An engine that loads models from a folder (vLLM, SGLang) gets the tiny random-init model saved
to one: config, weights (safetensors) and the offline tokenizer, in Hugging Face layout."""

from __future__ import annotations

import tempfile


def hf_folder(cfg, model, tokenizer) -> str:
    """cfg.model.path when set; otherwise a temporary folder holding `model` and `tokenizer`."""
    if cfg.model.path:
        return cfg.model.path
    folder = tempfile.mkdtemp(prefix="streamrl-model-")
    if not hasattr(model, "save_pretrained"):  # streamrl's tiny Llama: saved as transformers' Llama it mirrors
        from streamrl.models.tiny_llama import to_transformers

        model = to_transformers(model)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder
