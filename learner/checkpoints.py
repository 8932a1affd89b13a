"""Checkpoints that are either complete or never chosen.

DeepSpeed writes the model, optimizer and scheduler under `<dir>/<tag>/`. Only then does streamrl
write `<tag>/streamrl.json` (step, policy version, RNG states, accounting) and, last, point
`<dir>/latest` at the tag. Both files are written to a temporary name, fsynced and renamed, so a
crash at any moment leaves `latest` naming a checkpoint whose every file is on disk. On resume a
missing, empty or dangling `latest` falls back to the newest tag that has its streamrl.json.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import random
from pathlib import Path
from typing import Callable

import numpy as np
import torch

log = logging.getLogger("streamrl.learner")
STATE = "streamrl.json"
LATEST = "latest"  # DeepSpeed's own pointer file name and format (the tag as text)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power cut
    finally:
        os.close(dir_fd)


def save(directory: Path, tag: str, write_model: Callable[[str, str], None], state: dict) -> None:
    """write_model(directory, tag) writes DeepSpeed's files; state must be JSON-serialisable."""
    directory.mkdir(parents=True, exist_ok=True)
    write_model(str(directory), tag)
    write_atomic(directory / tag / STATE, json.dumps({**state, "tag": tag, "rng": rng_state()}))
    write_atomic(directory / LATEST, tag)


def newest_complete(directory: Path) -> tuple[str, dict] | None:
    """(tag, state) of the checkpoint to resume from, or None when there is none."""
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
    log.warning("checkpoints: %s does not name a complete checkpoint; resuming from %s, the newest complete one",
                directory / LATEST, tag)
    return tag, state


def _tags(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.is_dir()] if directory.is_dir() else []


def _state(directory: Path, tag: str) -> dict | None:
    try:
        return json.loads((directory / tag / STATE).read_text())
    except (OSError, ValueError):
        return None


def rng_state() -> dict:
    """Python, numpy and torch (CPU and CUDA) generator states, as JSON."""
    def b64(t: torch.Tensor) -> str:
        return base64.b64encode(t.numpy().tobytes()).decode()

    np_state = np.random.get_state()
    return {
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        "torch": b64(torch.get_rng_state()),
        "cuda": [b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
    }


def restore_rng(state: dict) -> None:
    def tensor(s: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(tensor(state["torch"]))
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensor(s) for s in state["cuda"]])
