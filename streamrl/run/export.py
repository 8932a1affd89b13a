"""`streamrl export RUN_DIR OUT [--step N] [--merge]`: a checkpoint of a run as a Hugging Face model folder
that `transformers.AutoModelForCausalLM.from_pretrained(OUT)` and `vllm serve OUT` load, with the logits the
learner computed from the same weights.

The checkpoint (streamrl/run/checkpoints.py) is the newest complete one whose files match its manifest (a damaged
one is passed over for the one before, said), or the one at `--step N` (refused when damaged); its
`policy.safetensors` holds the full policy under Hugging Face names. The folder around the weights:
- the tiny default (`model.path` unset): rebuilt from the run's config.yaml as transformers' Llama config,
  generation config and PreTrainedTokenizerFast (streamrl.models.hf_folder.save, the writer the vLLM and
  SGLang actors use for the initial model);
- a release (`model.path`): its files copied as they are (config, tokenizer and chat template, generation
  config, licence), the trained weights written beside them.
The weights go into safetensors shards with an index (streamrl.models.hf_folder.write_weights). OUT is
written under a temporary name beside it and renamed at the end: a failed export leaves nothing at OUT.

LoRA (an adapter checkpoint) plugs in at `policy_tensors`: with `merge` it returns the base weights with
the adapters merged, and everything after is unchanged; an adapter folder beside the base is written by
`export` once `policy_tensors` says the checkpoint holds an adapter (not built here: full weights only).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from pathlib import Path

import msgspec

from streamrl.config import Config
from streamrl.models import hf_folder
from streamrl.run import checkpoints


class ExportError(ValueError):
    """What cannot be exported, and why, in one line (the command prints it and exits 2)."""


@dataclasses.dataclass
class Exported:
    out: Path
    checkpoint: Path
    step: int
    policy_version: int | None
    shards: list[str]
    parameters: int
    kind: str
    """'tiny' or 'release'."""


ADAPTER = "adapter"  # a LoRA export without --merge: the PEFT adapter folder inside OUT


def checkpoint_folder(path: str | Path, step: int | None = None) -> Path:
    """The complete checkpoint folder to export: `path` is a run directory (runs/<name>), its checkpoints/
    folder, or one checkpoint tag folder; step: the checkpoint at that step (None: the newest complete)."""
    p = Path(path)
    if not p.exists():
        raise ExportError(f"{p}: no such run directory")
    if (p / checkpoints.STATE).is_file() or (p.parent.name == "checkpoints" and p.is_dir()):
        folder = p  # one checkpoint tag folder
        state = _state(folder)
        if step is not None and state.get("step") != step:
            raise ExportError(f"{folder}: holds step {state.get('step')}, not --step {step}")
        return _verified(folder)
    try:
        run = checkpoints.run_dir_of(p)
    except FileNotFoundError as e:
        raise ExportError(str(e)) from None
    directory = run / "checkpoints"
    complete = checkpoints.complete_newest_first(directory)
    if step is None:
        if not complete:
            raise ExportError(f"{directory}: no complete checkpoint (a finished run leaves one; "
                              "set learner.checkpoint_every to save them during a run)")
        try:
            newest = checkpoints.newest_usable(directory)  # past a damaged one to the one before, said
        except ValueError as e:
            raise ExportError(f"{e}; nothing to export") from None
        return _verified(directory / newest[0])
    at = [tag for tag, s in complete if s.get("step") == step]
    if at:
        return _verified(directory / at[0])
    if (directory / f"step-{step}").is_dir():
        raise ExportError(f"{directory / f'step-{step}'}: incomplete checkpoint (no {checkpoints.STATE}: the learner "
                          "stopped while writing it); choose another --step")
    steps = sorted(s["step"] for _, s in complete)
    raise ExportError(f"{directory}: no checkpoint at step {step}; complete ones: "
                      f"{', '.join(map(str, steps)) or 'none'}")


def _state(folder: Path) -> dict:
    try:
        return json.loads((folder / checkpoints.STATE).read_text())
    except OSError:
        raise ExportError(f"{folder}: incomplete checkpoint (no {checkpoints.STATE}: the learner stopped while "
                          "writing it); export another one") from None
    except ValueError:
        raise ExportError(f"{folder / checkpoints.STATE}: not JSON (the checkpoint is damaged)") from None


def _verified(folder: Path) -> Path:
    _state(folder)
    policy = folder / checkpoints.POLICY
    if not policy.is_file():
        raise ExportError(f"{policy}: missing (the checkpoint was written before checkpoints carried the policy's "
                          "weights); export a later one")
    if problem := checkpoints.problem_with(folder, deepspeed=False):
        raise ExportError(f"{problem}; the checkpoint is damaged: export an earlier one (--step)")
    return folder


def policy_tensors(folder: Path, cfg: Config, merge: bool = False) -> dict:
    """{Hugging Face name: tensor} of the policy in checkpoint `folder` (full weights: `merge` changes
    nothing). A LoRA checkpoint: its base with the adapters merged in (`merge`), else the base alone (the
    adapters then go beside it as a PEFT folder, see `export`)."""
    import torch
    from safetensors.torch import load_file

    from streamrl.models import lora

    state = load_file(str(folder / checkpoints.POLICY))
    if not lora.has_adapters(state):
        return state
    if not merge:  # lora_B = 0 folds nothing in: the frozen base's own weights under the plain names
        state = {k: torch.zeros_like(v) if lora.is_adapter(k) and "lora_B" in k else v for k, v in state.items()}
    return lora.merged(state, cfg.lora)


def export(path: str | Path, out: str | Path, step: int | None = None, merge: bool = False,
           max_shard_bytes: int = hf_folder.MAX_SHARD_BYTES) -> Exported:
    """Write the checkpoint of `path` (see `checkpoint_folder`) to the new folder `out`."""
    out = Path(out)
    if out.exists():
        raise ExportError(f"{out}: already exists; give a new folder (export never overwrites)")
    if not out.parent.is_dir():
        raise ExportError(f"{out.parent}: no such folder to export into")
    folder = checkpoint_folder(path, step)
    state = _state(folder)
    try:
        cfg = checkpoints.run_config(folder)
    except (ValueError, OSError) as e:  # a config.yaml this version cannot read (ConfigError is a ValueError)
        raise ExportError(f"{checkpoints.run_dir_of(folder) / 'config.yaml'}: cannot be read ({e})") from None
    tensors = policy_tensors(folder, cfg, merge)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        if cfg.model.path:
            kind = "release"
            source = Path(cfg.model.path).expanduser()
            if not (source / "config.json").is_file():
                raise ExportError(f"model.path={cfg.model.path!r} (the run's release): no config.json there; the export "
                                  "copies the release's config, tokenizer and generation config from that folder")
            dtype = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
            hf_folder.copy_release_files(source, tmp, dtype)
            shards = hf_folder.write_weights(tmp, tensors, tied=hf_folder.tied_output_layer(tmp),
                                             max_shard_bytes=max_shard_bytes)
        else:
            kind = "tiny"
            from streamrl.models import model as model_lib

            plain = msgspec.structs.replace(cfg, lora=msgspec.structs.replace(cfg.lora, rank=0))  # the base's shape
            model, tokenizer = model_lib.build(plain)
            model.load_state_dict(tensors, strict=True)  # the checkpoint's names are the model's
            shards = hf_folder.save(tmp, model, tokenizer, state=tensors, max_shard_bytes=max_shard_bytes)
        if cfg.lora.rank and not merge:  # the adapters as a PEFT folder beside their base: OUT/adapter
            from streamrl.models import lora

            lora.export(folder, cfg, out=tmp / ADAPTER)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Exported(out, folder, int(state.get("step", -1)), state.get("version"), shards,
                    sum(t.numel() for t in tensors.values()), kind)


def parse_size(text: str) -> int:
    """'5GB', '200MB', '64KiB', '1000' → bytes (decimal units as transformers reads them, binary with 'i')."""
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
    t = text.strip().upper()
    number = t.rstrip("KMGTIB")
    try:
        value = float(number) * units[t[len(number):]]
    except (ValueError, KeyError):
        raise ExportError(f"--max-shard-size={text!r}: give a size like 5GB, 200MB or 64MiB") from None
    if value < 1:
        raise ExportError(f"--max-shard-size={text!r}: must be at least one byte")
    return int(value)
