"""Load a trained policy from a run directory or a checkpoint folder, without DeepSpeed or pickle.

Accepted paths: a run directory (`runs/<name>/`: its `config.yaml` gives the config, the newest
complete checkpoint under `checkpoints/` gives the weights), its `checkpoints/` folder, or one
checkpoint tag folder (`runs/<name>/checkpoints/step-20/`). The weights are the tag's
`policy.safetensors`, which the learner writes into every checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from streamrl import checkpoints
from streamrl import config as config_lib


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
    if (p / checkpoints.POLICY).is_file():
        return p / checkpoints.POLICY
    folder = p if (p / checkpoints.LATEST).exists() or p.name == "checkpoints" else p / "checkpoints"
    newest = checkpoints.newest_complete(folder)
    if newest is None:
        raise FileNotFoundError(f"{folder}: no complete checkpoint (a finished run leaves one; "
                                "set learner.checkpoint_every to save them during a run)")
    weights = folder / newest[0] / checkpoints.POLICY
    if not weights.is_file():
        raise FileNotFoundError(f"{weights}: missing (checkpoint {newest[0]} was written before checkpoints "
                                "carried policy.safetensors)")
    return weights


def load_weights(model, path: str | Path) -> None:
    """Copy the tensors of a safetensors file into `model` (every parameter and buffer must match)."""
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(path)), strict=True)


def load_policy(cfg: config_lib.Config | None, path: str | Path):
    """(model, tokenizer) of the newest complete checkpoint at `path`, in eval mode on the CPU.

    The model is built by `streamrl.model.build(cfg)`; `cfg` None reads the run's config.yaml.
    """
    from streamrl import model as model_lib

    cfg = cfg or run_config(path)
    model, tokenizer = model_lib.build(cfg)
    load_weights(model, checkpoint_of(path))
    return model.eval(), tokenizer
