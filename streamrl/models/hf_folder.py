"""A policy as a Hugging Face model folder: what `transformers.AutoModelForCausalLM.from_pretrained`,
`vllm serve` and SGLang load. One writer for the initial model an engine starts from
(actors/backends/export.py) and for a trained checkpoint (`streamrl export`, streamrl/run/export.py).

The folder holds `config.json`, `generation_config.json`, the tokenizer files and the weights as
safetensors shards named `model-0000i-of-0000n.safetensors` with `model.safetensors.index.json`
(written even for one shard: every consumer looks for the index first, then globs the shards).

- The tiny default (`streamrl.models.tiny_llama` + `streamrl.models.word_tokenizer`) is written as
  transformers' LlamaForCausalLM and PreTrainedTokenizerFast, whose names and computations it mirrors.
  Its tokenizer gains a chat template that renders each message's content as it is, so a chat request
  reaches the model as the raw prompt it was trained on (streamrl never applied a template to it).
- A transformers model (a release loaded from `model.path`) writes its own config and generation config;
  `copy_release_files` instead copies a release folder's files but its weights, byte for byte (tokenizer,
  chat template, licence, custom code), for an export that must not change what the release ships.

Weights are written as given (their dtype is recorded in config.json's `dtype`); an output layer tied to
the embedding (`tie_word_embeddings`) is left out, as transformers leaves it out.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

INDEX = "model.safetensors.index.json"
MAX_SHARD_BYTES = 5 * 10**9
"""Largest shard, as transformers' `max_shard_size="5GB"` (a tensor larger than this gets a shard of its own)."""
RAW_PROMPT_TEMPLATE = "{%- for message in messages %}{{- message['content'] }}{%- endfor %}"
"""The tiny model's chat template: each message's text as it is, what streamrl prompted it with."""
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")
_WEIGHT_INDEXES = (INDEX, "pytorch_model.bin.index.json")


def save(folder: str | Path, model, tokenizer, state: dict | None = None,
         max_shard_bytes: int = MAX_SHARD_BYTES) -> list[str]:
    """Write `model` (tiny Llama or a transformers causal LM) and `tokenizer` to `folder` (created if
    needed). state: {name: tensor} to write instead of `model.state_dict()` (same names). Returns the
    shard file names."""
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config, generation = _configs(model)
    tensors = state if state is not None else model.state_dict()
    first = next(iter(tensors.values()), None)
    config.dtype = str(first.dtype if first is not None else torch.float32).removeprefix("torch.")
    config.save_pretrained(folder)
    generation.save_pretrained(folder)
    if hasattr(tokenizer, "to_transformers"):  # the tiny job's word tokenizer
        tokenizer = tokenizer.to_transformers()
        tokenizer.chat_template = RAW_PROMPT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return write_weights(folder, tensors, tied=bool(getattr(config, "tie_word_embeddings", False)),
                         max_shard_bytes=max_shard_bytes)


def _configs(model):
    """(transformers config, GenerationConfig) of `model`."""
    from transformers import GenerationConfig

    if hasattr(model, "save_pretrained"):  # a transformers model: a copy, the dtype is set on it
        import copy

        config = copy.deepcopy(model.config)
        generation = getattr(model, "generation_config", None) or GenerationConfig.from_model_config(config)
        return config, generation
    from streamrl.models.tiny_llama import transformers_config

    config = transformers_config(model.config)
    return config, GenerationConfig.from_model_config(config)


def copy_release_files(source: str | Path, folder: str | Path, dtype: str | None = None) -> list[str]:
    """Copy every file of the release folder `source` except its weights and their index into `folder`
    (created); dtype: the dtype of the weights that will sit beside them, recorded in config.json.
    Returns the names copied."""
    source, folder = Path(source), Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    copied = []
    for f in sorted(source.iterdir()):
        if f.name.startswith(".") or f.name in _WEIGHT_INDEXES or f.name.endswith(_WEIGHT_SUFFIXES):
            continue
        if f.is_dir():
            shutil.copytree(f, folder / f.name)
        else:
            shutil.copy2(f, folder / f.name)
        copied.append(f.name)
    if dtype is not None and (folder / "config.json").is_file():
        config = json.loads((folder / "config.json").read_text())
        config["dtype"] = dtype
        if "torch_dtype" in config:  # the older name; transformers 5 reads either
            config["torch_dtype"] = dtype
        (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return copied


def tied_output_layer(folder: str | Path) -> bool:
    """Whether the config.json in `folder` ties the output layer to the embedding."""
    try:
        return bool(json.loads((Path(folder) / "config.json").read_text()).get("tie_word_embeddings", False))
    except (OSError, ValueError):
        return False


def write_weights(folder: str | Path, tensors: dict, tied: bool = False,
                  max_shard_bytes: int = MAX_SHARD_BYTES) -> list[str]:
    """`tensors` ({name: tensor}) as safetensors shards of at most `max_shard_bytes` each, in name order,
    with the index that maps each name to its shard. tied: leave `lm_head.weight` out (the embedding
    provides it). Returns the shard file names."""
    from safetensors.torch import save_file

    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes={max_shard_bytes}: must be positive")
    folder = Path(folder)
    names = [n for n in tensors if not (tied and n == "lm_head.weight")]
    shards: list[list[str]] = [[]]
    size = 0
    for name in names:
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    total = 0
    for file, shard in zip(files, shards):
        # contiguous copies: safetensors refuses views and tensors that share memory
        part = {n: tensors[n].detach().to("cpu").contiguous().clone() for n in shard}
        total += sum(t.numel() * t.element_size() for t in part.values())
        save_file(part, str(folder / file), metadata={"format": "pt"})
    index = {"metadata": {"total_size": total},
             "weight_map": {n: file for file, shard in zip(files, shards) for n in shard}}
    (folder / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return files
