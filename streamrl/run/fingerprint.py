"""A run's fingerprint: the settings that shape its model, its data and its rewards, and what resume may change.

A fresh run writes `<run>/fingerprint.json` once (never rewritten on resume). `learner.resume=true` compares the
new config with it and with the run's config.yaml before anything in the run directory is written:
- a change to a SHAPING key (model shape, task, reward scale, estimator, group size) would train the checkpoint
  on something else or fail to load it: refused, naming each key with the run's value and the new one;
- any other change (lr, steps, logging, ...) is applied and stated: on the terminal and as one line in
  `<run>/resumes.jsonl` ({"time", "changes": {key: [old, new]}}). config.yaml then holds the new settings.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from streamrl import config as config_lib
from streamrl.run import jsonfiles

FILE = "fingerprint.json"
CHANGES = "resumes.jsonl"
# Prefixes of flattened config keys: a section name covers every key in it.
SHAPING = ("model", "task", "reward", "advantage.estimator", "actors.group_size", "mgrpo.enabled")
# Keys that differ between any two launches of the same run and change nothing it computes.
NOISE = ("name", "run_dir", "learner.resume", "transport.group_port", "transport.weights_port",
         "transport.weights_request_port", "transport.weight_sync_port")


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        out.update(flatten(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


def _under(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def settings(cfg: config_lib.Config) -> dict[str, Any]:
    """Every setting of `cfg`, flattened, as JSON and YAML read them back (tuples are lists)."""
    return flatten(json.loads(json.dumps(config_lib.to_dict(cfg))))


def of(cfg: config_lib.Config) -> dict[str, Any]:
    """The shaping settings of `cfg`, flattened."""
    return {k: v for k, v in settings(cfg).items() if _under(k, SHAPING)}


def record(cfg: config_lib.Config) -> None:
    """Write fingerprint.json for a fresh run (a resumed run keeps the one its first start wrote)."""
    path = cfg.run_path / FILE
    if not path.exists():
        jsonfiles.write(path, of(cfg))


def _old_settings(run_path: Path) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(fingerprint, flattened config.yaml) of the run on disk; None for a file that is missing or unreadable."""
    fp = cfg = None
    try:
        fp = json.loads((run_path / FILE).read_text())
    except (OSError, ValueError):
        pass
    try:
        raw = yaml.safe_load((run_path / "config.yaml").read_text())
        cfg = flatten(raw) if isinstance(raw, dict) else None
    except (OSError, yaml.YAMLError):
        pass
    return fp, cfg


def _show(v: Any) -> str:
    return json.dumps(v)


def compare(cfg: config_lib.Config) -> tuple[list[str], dict[str, list]]:
    """(refusals, safe changes) of resuming the run at cfg.run_path with `cfg`. A refusal is one line per
    shaping key that differs; safe changes are {key: [old, new]} against the run's config.yaml."""
    old_fp, old_cfg = _old_settings(cfg.run_path)
    new = settings(cfg)
    # A run from before fingerprints: its config.yaml (if still the run's own) holds the same keys.
    old_fp = old_fp if old_fp is not None else {k: v for k, v in (old_cfg or {}).items() if _under(k, SHAPING)}
    refusals = [f"{k}: the run has {_show(v)}, now {_show(new.get(k))}"
                for k, v in old_fp.items() if new.get(k, v) != v]
    refusals += [f"{k}: the run has none, now {_show(v)}" for k, v in of(cfg).items() if k not in old_fp and old_fp]
    changes = {k: [old_cfg.get(k), v] for k, v in new.items()
               if old_cfg is not None and old_cfg.get(k) != v and not _under(k, NOISE) and not _under(k, SHAPING)}
    return refusals, changes


def resume_problem(cfg: config_lib.Config) -> str | None:
    """One line refusing `learner.resume=true` with a config that would corrupt the run; None when it may go on."""
    refusals, _ = compare(cfg)
    if not refusals:
        return None
    return (f"learner.resume=true: {cfg.run_path} was trained with other settings that shape the model, data or "
            f"rewards ({'; '.join(refusals)}); resume with the run's own values, or start a new run (name=...)")


def accept(cfg: config_lib.Config) -> dict[str, list]:
    """Once a resume is accepted: append its safe changes to resumes.jsonl (nothing when none); returns them."""
    _, changes = compare(cfg)
    if changes:
        with open(cfg.run_path / CHANGES, "a") as f:
            f.write(jsonfiles.line({"time": time.time(), "changes": changes}))
    return changes


def differences(learner: dict[str, Any], actor: dict[str, Any]) -> list[str]:
    """'task.name: learner "copy", actor "reverse"' for each shaping key on which two fingerprints differ."""
    return [f"{k}: learner {_show(learner.get(k))}, actor {_show(actor.get(k))}"
            for k in sorted(set(learner) | set(actor)) if learner.get(k) != actor.get(k)]


def describe(changes: dict[str, list]) -> str:
    """'optim.lr 0.0003 -> 0.001, steps 300 -> 400'."""
    return ", ".join(f"{k} {_show(a)} -> {_show(b)}" for k, (a, b) in changes.items())
