"""An engine that loads models from a folder (vLLM, SGLang) gets the tiny random-init model saved
to one, in Hugging Face layout (streamrl.models.hf_folder: the same writer as `streamrl export`)."""

from __future__ import annotations

import tempfile

from streamrl.models import hf_folder as hf_folder_lib


def hf_folder(cfg, model, tokenizer) -> str:
    """cfg.model.path when set; otherwise a temporary folder holding `model` and `tokenizer`."""
    if cfg.model.path:
        return cfg.model.path
    folder = tempfile.mkdtemp(prefix="streamrl-model-")
    hf_folder_lib.save(folder, model, tokenizer)
    return folder
