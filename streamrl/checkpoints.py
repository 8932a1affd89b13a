"""Finding checkpoints, read-only: what the learner resumes from and what evaluation tools load.

A checkpoint is the folder `<run>/checkpoints/<tag>/`. It is *complete* once its `streamrl.json`
is on disk: the learner writes DeepSpeed's files and `policy.safetensors` (the full policy weights,
loadable without DeepSpeed or pickle) first, then `streamrl.json`, then points `latest` at the tag.
Writing is the learner's (`learner.checkpoints`); this module only reads.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger("streamrl.checkpoints")
STATE = "streamrl.json"
LATEST = "latest"  # DeepSpeed's own pointer file name and format (the tag as text)
POLICY = "policy.safetensors"


def newest_complete(directory: Path) -> tuple[str, dict] | None:
    """(tag, state) of the newest complete checkpoint under `directory`, or None when there is none.

    `latest` names it normally; a missing, empty or dangling `latest` falls back to the complete
    tag with the highest step (and says so).
    """
    directory = Path(directory)
    try:
        tag = (directory / LATEST).read_text().strip()
    except OSError:
        tag = ""
    state = _state(directory, tag) if tag else None
    if state is not None:
        return tag, state
    complete = [(s["step"], t, s) for t in _tags(directory) if (s := _state(directory, t)) is not None]
    if not complete:
        return None
    _, tag, state = max(complete)
    log.warning("checkpoints: %s does not name a complete checkpoint; using %s, the newest complete one",
                directory / LATEST, tag)
    return tag, state


def _tags(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.is_dir()] if directory.is_dir() else []


def _state(directory: Path, tag: str) -> dict | None:
    try:
        return json.loads((directory / tag / STATE).read_text())
    except (OSError, ValueError):
        return None
