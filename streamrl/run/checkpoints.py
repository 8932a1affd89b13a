"""The checkpoint format, and reading it: what the learner resumes from and what evaluation tools load.

A checkpoint is the folder `<run>/checkpoints/<tag>/`. It is *complete* once its `streamrl.json`
is on disk: the learner writes DeepSpeed's files and `policy.safetensors` (the full policy weights,
loadable without DeepSpeed or pickle) first, then `streamrl.json`, then points `latest` at the tag.
Last comes `manifest.json`, the SHA-256 of every file (streamrl.run.manifest): what is loaded is checked against it
first, and a damaged checkpoint is passed over for the previous complete one (`newest_usable`, resume's own loop).
Writing is the learner's (`learner.checkpoints`); this module only reads.

A trained policy loads from a run directory (`runs/<name>/`: its `config.yaml` gives the config, the
newest complete checkpoint under `checkpoints/` gives the weights), its `checkpoints/` folder, or one
checkpoint tag folder (`runs/<name>/checkpoints/step-20/`), without DeepSpeed or pickle.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from streamrl import config as config_lib
from streamrl.run import manifest

log = logging.getLogger("streamrl.run.checkpoints")
STATE = "streamrl.json"
LATEST = "latest"  # DeepSpeed's own pointer file name and format (the tag as text)
POLICY = "policy.safetensors"


def newest_complete(directory: Path) -> tuple[str, dict] | None:
    """(tag, state) of the newest complete checkpoint under `directory`, or None when there is none.

    The complete tag with the highest step; `latest` names it normally, and when a missing, empty, dangling or
    stale `latest` does not, that is said.
    """
    found = complete_newest_first(directory, warn=True)
    return found[0] if found else None


def complete_newest_first(directory: Path, warn: bool = False) -> list[tuple[str, dict]]:
    """Every complete checkpoint under `directory` as (tag, state), by step, newest first. `latest` is not trusted
    to name the newest: a learner killed after a checkpoint's streamrl.json was written but before `latest` moved
    left a newer complete one (each candidate is checked, and a stale `latest` said)."""
    directory = Path(directory)
    try:
        tag = (directory / LATEST).read_text().strip()
    except OSError:
        tag = ""
    complete = sorted(((s["step"], t, s) for t in _tags(directory) if (s := _state(directory, t)) is not None),
                      key=lambda c: (c[0], c[1]), reverse=True)
    ordered = [(t, s) for _, t, s in complete]
    if ordered and ordered[0][0] == tag:
        return ordered
    if ordered and warn and any(t == tag for t, _ in ordered):
        log.warning("checkpoints: %s names %s, but %s is complete and newer (the pointer did not move before the "
                    "learner stopped); using %s", directory / LATEST, tag, ordered[0][0], ordered[0][0])
    elif ordered and warn:
        log.warning("checkpoints: %s does not name a complete checkpoint; using %s, the newest complete one",
                    directory / LATEST, ordered[0][0])
    return ordered


def newest_usable(directory: Path) -> tuple[str, dict] | None:
    """(tag, state) of the newest complete checkpoint under `directory` whose files check out (`problem_with`, the
    policy's side: what eval and export read); each newer one passed over is said, naming the file and why. None
    when there is no complete checkpoint; ValueError naming every problem when none checks out."""
    directory = Path(directory)
    skipped = []
    for tag, state in complete_newest_first(directory, warn=True):
        problem = problem_with(directory / tag, state, deepspeed=False)
        if problem is None:
            if skipped:
                log.warning("checkpoints: using %s, the newest usable checkpoint", tag)
            return tag, state
        log.warning("checkpoints: skipping %s: %s", tag, problem)
        skipped.append(problem)
    if skipped:
        raise ValueError(f"{directory}: no usable checkpoint ({'; '.join(skipped)})")
    return None


def problem_with(folder: Path, state: dict | None = None, deepspeed: bool = True) -> str | None:
    """What is wrong with the files of a complete checkpoint folder (naming the file), or None.

    Every file against the checkpoint's manifest (streamrl.run.manifest; `state`: its streamrl.json, read here when
    not given), then cheap checks that catch a truncated or missing file without loading it (all an older
    checkpoint without a manifest gets): policy.safetensors's header and length, every `*.json` parses, and with
    `deepspeed` (what resume loads; eval and export read the policy) every DeepSpeed `*.pt` file a readable zip
    archive (PyTorch's format).
    """
    folder = Path(folder)
    state = state if state is not None else (_state(folder.parent, folder.name) or {})
    if problem := manifest.problem(folder, state):
        return problem
    if (folder / POLICY).exists() and (problem := policy_problem(folder / POLICY)):
        return problem
    for path in sorted(folder.glob("*.json")):
        try:
            json.loads(path.read_text())
        except (OSError, ValueError):
            return f"{path}: truncated or not JSON"
    if not deepspeed:
        return None
    if not list(folder.glob("*model_states.pt")):
        return f"{folder}: DeepSpeed's model states (*model_states.pt) are missing"
    for pt in sorted(folder.glob("*.pt")):
        if problem := _zip_problem(pt):
            return problem
    return None


def policy_problem(path: Path) -> str | None:
    """Whether a safetensors file is whole: its header parses and its length is what the header says."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if size < 8 or n > size - 8:
                return f"{path}: truncated ({size} bytes; not a whole safetensors file)"
            header = json.loads(f.read(n))
    except OSError as e:
        return f"{path}: cannot be read ({e.strerror or e})"
    except ValueError:
        return f"{path}: not a safetensors file (its header is not JSON)"
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if size != 8 + n + end:
        return f"{path}: truncated ({size} bytes where its header describes {8 + n + end})"
    return None


def _zip_problem(path: Path) -> str | None:
    import zipfile

    try:
        size = path.stat().st_size
        with zipfile.ZipFile(path) as z:
            if any(i.header_offset + i.compress_size > size for i in z.infolist()):
                return f"{path}: truncated"
    except (OSError, zipfile.BadZipFile) as e:
        return f"{path}: truncated or not a PyTorch file ({e})"
    return None


def _tags(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.is_dir()] if directory.is_dir() else []


def _state(directory: Path, tag: str) -> dict | None:
    try:
        return json.loads((directory / tag / STATE).read_text())
    except (OSError, ValueError):
        return None


def run_dir_of(path: str | Path) -> Path:
    """The run directory a run dir, checkpoints folder or checkpoint tag folder belongs to."""
    p = Path(path)
    for candidate in (p, p.parent, p.parent.parent):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"{p}: not a run directory or checkpoint folder (no config.yaml here or above; "
                            "give runs/<name>/ or runs/<name>/checkpoints/<tag>/)")


def run_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> config_lib.Config:
    """The run's resolved config (its config.yaml) with `key=value` overrides applied."""
    return config_lib.load(run_dir_of(path) / "config.yaml", overrides)


def checkpoint_of(path: str | Path) -> Path:
    """The policy.safetensors of a checkpoint tag folder, or of the newest complete checkpoint of a run."""
    p = Path(path)
    if (p / POLICY).is_file():  # the checkpoint asked for: checked, never another one instead
        if problem := problem_with(p, deepspeed=False):
            raise ValueError(f"{problem}; the checkpoint is damaged: use another one (runs/<name>/checkpoints/<tag>/)")
        return p / POLICY
    folder = p if (p / LATEST).exists() or p.name == "checkpoints" else p / "checkpoints"
    newest = newest_usable(folder)
    if newest is None:
        raise FileNotFoundError(f"{folder}: no complete checkpoint (a finished run leaves one; "
                                "set learner.checkpoint_every to save them during a run)")
    weights = folder / newest[0] / POLICY
    if not weights.is_file():
        raise FileNotFoundError(f"{weights}: missing (checkpoint {newest[0]} was written before checkpoints "
                                "carried policy.safetensors)")
    return weights


def load_weights(model, path: str | Path) -> None:
    """Copy the tensors of a safetensors file into `model` (every parameter and buffer must match).
    A damaged file is a ValueError that names it."""
    from safetensors.torch import load_file

    if problem := policy_problem(Path(path)):
        raise ValueError(f"{problem}; the checkpoint is damaged: evaluate an earlier one "
                         "(runs/<name>/checkpoints/<tag>/)")
    try:
        tensors = load_file(str(path))
    except Exception as e:  # safetensors' own error says what, not which file
        raise ValueError(f"{path}: cannot be read as safetensors ({e})") from None
    model.load_state_dict(tensors, strict=True)


def load_policy(cfg: config_lib.Config | None, path: str | Path, weights: Path | None = None):
    """(model, tokenizer) of the newest usable checkpoint at `path` (or of its policy file `weights`, as
    `checkpoint_of` chose it), in eval mode on the CPU.

    The model is built by `streamrl.models.model.build(cfg)`; `cfg` None reads the run's config.yaml.
    """
    from streamrl.models import model as model_lib

    cfg = cfg or run_config(path)
    model, tokenizer = model_lib.build(cfg)
    load_weights(model, weights or checkpoint_of(path))
    return model.eval(), tokenizer
