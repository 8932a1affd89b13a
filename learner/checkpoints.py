"""Checkpoints that are either complete or never chosen.

DeepSpeed writes the model, optimizer and scheduler under `<dir>/<tag>/`, streamrl the full policy
weights as `<tag>/policy.safetensors` (what `streamrl eval` and `streamrl uplift` load, without
DeepSpeed or pickle). Only then does streamrl write `<tag>/streamrl.json` (step, policy version, RNG
states, accounting) and, last, point `<dir>/latest` at the tag. Each file is written to a temporary
name, fsynced and renamed, so a crash at any moment leaves `latest` naming a checkpoint whose every
file is on disk. On resume a missing, empty or dangling `latest` falls back to the newest tag that
has its streamrl.json (`streamrl.checkpoints.newest_complete`, the read side, shared with tools
outside the learner).
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

from streamrl.checkpoints import LATEST, POLICY, STATE, newest_complete  # noqa: F401  (the read side, shared)

log = logging.getLogger("streamrl.learner")


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


def save(directory: Path, tag: str, write_model: Callable[[str, str], None], state: dict,
         policy: dict[str, torch.Tensor] | None = None) -> None:
    """write_model(directory, tag) writes DeepSpeed's files; state must be JSON-serialisable;
    `policy` (full weights, {name: tensor}) goes to <tag>/policy.safetensors before the checkpoint is complete."""
    directory.mkdir(parents=True, exist_ok=True)
    write_model(str(directory), tag)
    if policy is not None:
        write_policy(directory / tag / POLICY, policy)
    write_atomic(directory / tag / STATE, json.dumps({**state, "tag": tag, "rng": rng_state()}))
    write_atomic(directory / LATEST, tag)


def write_policy(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """A safetensors file, written to a temporary name, fsynced and renamed.

    Every tensor is cloned: safetensors refuses tensors that share memory (tied embeddings).
    """
    from safetensors.torch import save_file

    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}, str(tmp))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
