"""LoRA adapters on a frozen base, through peft, on the tiny plain-torch Llama and on transformers models alike.

`apply` injects peft's LoRA layers in place (`peft.inject_adapter_in_model`: it needs only module names,
not a transformers PreTrainedModel, so the tiny `TinyLlamaForCausalLM` takes it as a Qwen3 does). Every
frozen base weight keeps its dtype (bf16 allowed); the adapters are fp32. `model.build` calls it on the
learner and on every actor, so both hold the same module tree and state-dict names
(`...q_proj.base_layer.weight`, `...q_proj.lora_A.default.weight` (r, in), `...q_proj.lora_B.default.weight`
(out, r)).

What travels to actors is `published(state)`: the adapter tensors only. `merged` folds the adapters into
the base and gives the plain model's names back (what eval on another stack and `streamrl export --merge`
want); `write_adapter_folder` writes a PEFT adapter folder (adapter_config.json + adapter_model.safetensors,
PEFT's key names) that `PeftModel.from_pretrained`, vLLM's `LoRARequest` and SGLang's `load_lora_adapter`
read beside the base model.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from streamrl.config import Config

ADAPTER_NAME = "default"
_ADAPTER = re.compile(r"\.lora_(A|B|embedding_A|embedding_B|magnitude_vector)\.")
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"


def enabled(lcfg) -> bool:
    """Whether a config's `lora` section turns LoRA on (rank > 0)."""
    return lcfg is not None and lcfg.rank > 0


def peft_config(lcfg, base: str | None = None):
    """peft.LoraConfig of a streamrl `lora` section (base: the base model's name or path, recorded in the folder)."""
    from peft import LoraConfig

    return LoraConfig(r=lcfg.rank, lora_alpha=lcfg.alpha, lora_dropout=lcfg.dropout,
                      target_modules=list(lcfg.target_modules), bias="none", task_type="CAUSAL_LM",
                      base_model_name_or_path=base)


def apply(model, lcfg, seed: int = 0):
    """Inject LoRA adapters into `model` in place (and return it): base frozen in its dtype, adapters fp32 and
    trainable. lora_A is drawn from `seed` without touching the global RNG; lora_B starts at zero, so the
    adapted model equals the base until the first step."""
    import torch
    from peft import inject_adapter_in_model

    try:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            inject_adapter_in_model(peft_config(lcfg), model, adapter_name=ADAPTER_NAME)
    except ValueError as e:  # peft: "Target modules {...} not found in the base model"
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ValueError(f"lora.target_modules={list(lcfg.target_modules)}: {e}; this model's linear modules "
                         f"are {linear}") from None
    for name, p in model.named_parameters():
        if is_adapter(name):
            p.data = p.data.float()
            p.requires_grad_(True)
        else:
            p.requires_grad_(False)
    return model


def is_adapter(name: str) -> bool:
    """Whether a parameter or state-dict name is a LoRA adapter's."""
    return _ADAPTER.search(name) is not None


def has_adapters(state) -> bool:
    return any(is_adapter(k) for k in state)


def published(state: dict) -> dict:
    """What a version carries: the adapter tensors when the model has any, else every tensor."""
    adapters = {k: v for k, v in state.items() if is_adapter(k)}
    return adapters or state


def merged(state: dict, lcfg) -> dict:
    """The plain model's state dict ({name: tensor}, base names, base dtypes) with every adapter folded in:
    W + (alpha / rank) * B @ A, computed in fp32. `state`: a LoRA model's full state dict (policy.safetensors)."""

    scale = lcfg.alpha / lcfg.rank
    out = {}
    for name, t in state.items():
        if is_adapter(name):
            continue
        if ".base_layer." in name:
            module, leaf = name.split(".base_layer.")
            a = state.get(f"{module}.lora_A.{ADAPTER_NAME}.weight")
            b = state.get(f"{module}.lora_B.{ADAPTER_NAME}.weight")
            if leaf == "weight" and a is not None and b is not None:
                t = (t.float() + scale * (b.float() @ a.float())).to(t.dtype)
            name = f"{module}.{leaf}"
        out[name] = t
    return out


def peft_keys(adapters: dict) -> dict:
    """Adapter tensors under PEFT's saved names: `base_model.model.<module>.lora_A.weight` (no adapter name)."""
    return {"base_model.model." + k.replace(f".{ADAPTER_NAME}.", "."): v for k, v in adapters.items() if is_adapter(k)}


def from_peft_keys(tensors: dict) -> dict:
    """The inverse of `peft_keys`: a PEFT adapter file's tensors under this model's state-dict names."""
    out = {}
    for k, v in tensors.items():
        name = k.removeprefix("base_model.model.")
        out[re.sub(r"\.(lora_A|lora_B)\.", rf".\1.{ADAPTER_NAME}.", name)] = v
    return out


def write_adapter_folder(folder: str | Path, adapters: dict, lcfg, base: str | None) -> Path:
    """A PEFT adapter folder: adapter_config.json (naming `base`) and adapter_model.safetensors (fp32)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().float().contiguous().clone() for k, v in peft_keys(adapters).items()}
    if not tensors:
        raise ValueError(f"{folder}: no LoRA adapter tensors to write (the state holds no lora_A/lora_B)")
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / CONFIG_FILE).write_text(json.dumps(adapter_config(lcfg, base), indent=2))
    return folder


def adapter_config(lcfg, base: str | None) -> dict:
    """adapter_config.json's content (peft's LoraConfig as JSON: sets become sorted lists)."""
    cfg = peft_config(lcfg, base).to_dict()
    return json.loads(json.dumps({k: (sorted(v) if isinstance(v, set) else v) for k, v in cfg.items()}, default=str))


def read_adapter_folder(folder: str | Path) -> tuple[dict, dict]:
    """(adapter tensors under this model's names, adapter_config.json) of a PEFT adapter folder."""
    from safetensors.torch import load_file

    folder = Path(folder)
    return from_peft_keys(load_file(str(folder / WEIGHTS_FILE))), json.loads((folder / CONFIG_FILE).read_text())


def base_name(cfg: Config) -> str:
    """What the adapters sit on: model.path, or the tiny model with its seed and shape (the same weights for them)."""
    m = cfg.model
    return m.path or (f"streamrl-tiny(seed={cfg.seed}, hidden={m.hidden_size}, layers={m.num_layers}, "
                      f"heads={m.num_heads}, mlp={m.intermediate_size}, context={m.context}, dtype={m.dtype})")


def count(model) -> tuple[int, int]:
    """(adapter parameters, frozen base parameters) of a LoRA model."""
    adapters = sum(p.numel() for n, p in model.named_parameters() if is_adapter(n))
    return adapters, sum(p.numel() for n, p in model.named_parameters() if not is_adapter(n))


ADAPTER_DIR = "adapter"
"""A LoRA checkpoint's PEFT adapter folder, beside policy.safetensors."""


def save_in_checkpoint(folder: Path, adapters: dict, cfg: Config) -> Path:
    """Write a checkpoint tag folder's `adapter/` (the adapters, naming the base they sit on)."""
    return write_adapter_folder(Path(folder) / ADAPTER_DIR, adapters, cfg.lora, base_name(cfg))


def export(checkpoint: str | Path, cfg: Config, out: str | Path | None = None, merge: bool = False):
    """For `streamrl export`: a LoRA checkpoint's weights as a plain model's or as a PEFT adapter folder.

    checkpoint: a tag folder (holding policy.safetensors). merge=True returns the base model's state dict
    ({name: tensor}, base names and dtypes) with the adapters folded in, for export to write as a Hugging Face
    model folder; merge=False writes the PEFT adapter folder to `out` (adapter_config.json naming cfg.model.path
    as the base, adapter_model.safetensors) and returns its path.
    """
    from safetensors.torch import load_file

    state = load_file(str(Path(checkpoint) / "policy.safetensors"))
    if not has_adapters(state):
        raise ValueError(f"{checkpoint}: not a LoRA checkpoint (policy.safetensors holds no lora_A/lora_B tensors)")
    if merge:
        return merged(state, cfg.lora)
    if out is None:
        raise ValueError("export without merge: give the adapter folder to write (out)")
    return write_adapter_folder(out, published(state), cfg.lora, base_name(cfg))
