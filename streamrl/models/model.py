"""Builds the policy model and tokenizer the same way on the learner and on every actor.

With `model.path` unset this is the tiny CPU default: a random-init Llama sized by the config
(`streamrl.models.tiny_llama`: transformers' LlamaForCausalLM in plain torch, the same weights for a seed) and
a word-level tokenizer made offline from the task's vocabulary (`streamrl.models.word_tokenizer`), so nothing
is downloaded and transformers is not even imported. With `lora.rank` > 0 either one gets peft's LoRA adapters
(`streamrl.models.lora`) on a frozen base. Actors replace the random weights with the
learner's before they generate anything.

`model.path` is a local Hugging Face folder, or a hub id (`Qwen/Qwen3-8B`) where the machine may
download; `path_problem` says in one line why a path cannot work, before any process starts.
`end_token_ids` lists every token that ends a completion (a release's generation_config may name
several: Qwen3 stops at `<|im_end|>` and `<|endoftext|>`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from streamrl.config import Config
from streamrl.models.word_tokenizer import SPECIAL_TOKENS  # noqa: F401  (the tiny tokenizer's specials, ids 0-3)


def build_tokenizer(words: list[str]):
    """The tiny job's tokenizer: one token per word (whitespace-split), made offline
    (`streamrl.models.word_tokenizer`: PreTrainedTokenizerFast's ids and text without importing transformers)."""
    from streamrl.models.word_tokenizer import WordTokenizer

    return WordTokenizer(words)


def build(cfg: Config, task_words: list[str] | None = None):
    """(model, tokenizer) for `cfg` (a streamrl Config). Model weights are seeded by cfg.seed."""
    import torch

    dtype = getattr(torch, cfg.model.dtype)
    if cfg.model.path:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = cfg.model.path
        # A folder is read as it is; a hub id may download, unless HF_HUB_OFFLINE says otherwise.
        local = Path(path).expanduser().is_dir()
        source = str(Path(path).expanduser()) if local else path
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local)
        model = AutoModelForCausalLM.from_pretrained(source, local_files_only=local, dtype=dtype)
    else:
        from streamrl.models.tiny_llama import TinyLlamaConfig, TinyLlamaForCausalLM

        if task_words is None:
            from streamrl import tasks

            task_words = tasks.build(cfg.task).vocabulary
        if cfg.mgrpo.enabled:  # layer-2 queries hold a guiding phrase
            from streamrl.algo.mgrpo import phrase_words

            task_words = [*task_words, *phrase_words(cfg.mgrpo.phrases)]
        tokenizer = build_tokenizer(task_words)
        m = cfg.model
        config = TinyLlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=m.hidden_size,
            intermediate_size=m.intermediate_size,
            num_hidden_layers=m.num_layers,
            num_attention_heads=m.num_heads,
            num_key_value_heads=m.num_heads,
            max_position_embeddings=m.context,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        with torch.random.fork_rng():
            torch.manual_seed(cfg.seed)
            model = TinyLlamaForCausalLM(config).to(dtype)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    lcfg = getattr(cfg, "lora", None)
    if lcfg is not None and lcfg.rank > 0:  # the same adapters, by name, on the learner and every actor
        from streamrl.models import lora

        lora.apply(model, lcfg, cfg.seed)
    return model, tokenizer


def vocab_size(model) -> int:
    return int(model.get_input_embeddings().weight.shape[0])


def end_token_ids(model, tokenizer) -> list[int]:
    """Every token id that ends a completion: the tokenizer's EOS, then each one the model's
    generation config lists (`eos_token_id` may be an int or a list there), without repeats."""
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    more = getattr(gen, "eos_token_id", None) if gen is not None else None
    for i in ([more] if isinstance(more, int) else list(more or [])):
        if int(i) not in ids:
            ids.append(int(i))
    if not ids:
        raise ValueError("the model names no end token (tokenizer.eos_token_id and generation_config.eos_token_id "
                         "are both unset); generation could never stop before its cap")
    return ids


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def offline() -> bool:
    """True when Hugging Face downloads are switched off (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)."""
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def path_problem(path: str | None, ask_hub: bool = True) -> str | None:
    """Why `model.path` cannot be loaded, in one line (None: it can). A folder must hold config.json;
    a name that is no folder here must be a hub id that is cached, or downloadable (ask_hub: the hub
    is asked whether it exists, so a typo fails now rather than when the processes load it)."""
    if path is None:
        return None
    where = Path(path).expanduser()
    if where.is_dir():
        if not (where / "config.json").is_file():
            return (f"model.path={path!r}: the folder has no config.json; a Hugging Face model folder holds "
                    "config.json, the weights (*.safetensors) and the tokenizer files")
        return None
    if where.exists():
        return f"model.path={path!r}: is a file; give the model's folder (with config.json) or a hub id"
    if not _HUB_ID.fullmatch(path):
        return f"model.path={path!r}: no such folder (give a local Hugging Face model folder, or a hub id like Qwen/Qwen3-8B)"
    try:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(path, "config.json"), str):
            return None  # in the local Hugging Face cache
    except Exception:  # a malformed id: reported below like any other missing model
        pass
    here = f"no such folder (relative to {Path.cwd()})" if not where.is_absolute() else "no such folder"
    hint = "e.g. huggingface-cli download Qwen/Qwen3-8B --local-dir models/Qwen3-8B, then model.path=models/Qwen3-8B"
    if offline():
        return (f"model.path={path!r}: {here}, and as a hub id it is not in the local cache while downloads are off "
                f"(HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE); give the folder of a downloaded model ({hint})")
    if not ask_hub:
        return None
    try:
        from huggingface_hub import HfApi

        HfApi().model_info(path, timeout=10)
    except Exception as e:  # not found, gated, or no network: all mean the run would fail later
        reason = type(e).__name__
        return (f"model.path={path!r}: {here}, and the Hugging Face hub did not provide it ({reason}); "
                f"give the folder of a downloaded model ({hint})")
    return None
