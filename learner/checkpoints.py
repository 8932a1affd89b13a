"""Checkpoints that are either complete or never chosen.

DeepSpeed writes the model, optimizer and scheduler under `<dir>/<tag>/`, streamrl the full policy
weights as `<tag>/policy.safetensors` (what `streamrl eval` and `streamrl uplift` load, without
DeepSpeed or pickle). Only then does streamrl write `<tag>/streamrl.json` (step, policy version, RNG
states, accounting), then `<tag>/manifest.json` (the SHA-256 of every file: streamrl.run.manifest) and, last,
point `<dir>/latest` at the tag. Each file is written to a temporary
name, fsynced and renamed, so a crash at any moment leaves `latest` naming a checkpoint whose every
file is on disk. On resume a missing, empty or dangling `latest` falls back to the newest tag that
has its streamrl.json (`streamrl.run.checkpoints.newest_complete`, the read side, shared with tools
outside the learner). A save that fails (a full disk, a crash) removes its partial tag folder; a
full disk raises `streamrl.run.storage.DiskFull` naming the checkpoint. Resume (`resume`) verifies a
checkpoint's files against its manifest before loading it and falls back past a damaged one (a flipped byte, a
truncated data_cursor.json), naming the bad file.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from streamrl.run import manifest, storage
from streamrl.run.checkpoints import LATEST, POLICY, STATE, complete_newest_first, newest_complete, problem_with  # noqa: F401  (the read side, shared)

log = logging.getLogger("streamrl.learner")


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power cut
    finally:
        os.close(dir_fd)


def save(directory: Path, tag: str, write_model: Callable[[str, str], None], state: dict,
         policy: dict[str, torch.Tensor] | None = None, extra: Callable[[Path], None] | None = None) -> None:
    """write_model(directory, tag) writes DeepSpeed's files; state must be JSON-serialisable;
    `policy` (full weights, {name: tensor}) goes to <tag>/policy.safetensors and extra(<tag folder>) writes
    more files (LoRA's adapter folder) before the checkpoint is complete."""
    folder = directory / tag
    was_complete = (folder / STATE).is_file()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        write_model(str(directory), tag)
        if policy is not None:
            write_policy(folder / POLICY, policy)
        if extra is not None:
            extra(folder)
        state = {**state, "tag": tag, "rng": rng_state(), "manifest": manifest.MANIFEST}
        write_atomic(folder / STATE, json.dumps(state))
        write_atomic(folder / manifest.MANIFEST, json.dumps(manifest.entries(folder), indent=1))  # last: it covers all
    except BaseException as e:
        full = storage.is_disk_full(e, directory)  # before removing the partial files frees space
        if not was_complete:
            shutil.rmtree(folder, ignore_errors=True)  # a partial checkpoint is never left behind
        if full:
            newest = newest_complete(directory)
            raise storage.DiskFull(folder, "checkpoint", "removed the partial checkpoint; the newest complete one "
                                   f"is {newest[0] if newest else 'none'}") from e
        raise
    try:
        write_atomic(directory / LATEST, tag)
    except OSError as e:  # the checkpoint is complete; resume finds it without `latest`
        if storage.is_disk_full(e, directory):
            raise storage.DiskFull(directory / LATEST, "the checkpoint pointer", f"checkpoint {tag} itself is complete") from e
        raise


def write_policy(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """A safetensors file, written to a temporary name, fsynced and renamed.

    Every tensor is cloned: safetensors refuses tensors that share memory (tied embeddings).
    """
    from safetensors.torch import save_file

    tmp = path.with_name(path.name + ".tmp")
    try:
        save_file({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}, str(tmp))
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
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


def model_mismatch(e: BaseException) -> str | None:
    """The first line of torch's load_state_dict complaint when a checkpoint is for another model shape, else None."""
    text = str(e)
    for marker in ("size mismatch for", "Missing key(s) in state_dict", "Unexpected key(s) in state_dict"):
        if marker in text:
            at = text.index(marker)
            return text[at:].splitlines()[0].strip()[:300]


def _lora_mismatch(engine, state: dict) -> str | None:
    """Why a checkpoint cannot resume this run's LoRA setting (DeepSpeed loads a LoRA checkpoint non-strictly, so
    a full-weights checkpoint would otherwise load into adapters it lacks without a word), or None."""
    lora = getattr(engine, "lora", False)
    saved = state.get("lora")
    if lora and not saved:
        return "a full fine-tuning checkpoint; this run has lora.rank > 0 (resume it with lora.rank=0)"
    if saved and not lora:
        return f"a LoRA checkpoint (rank {saved.get('rank')}, base {saved.get('base')}); this run has lora.rank=0"
    if saved and lora and saved.get("rank") != engine.cfg.lora.rank:
        return f"LoRA rank {saved.get('rank')}; this run has lora.rank={engine.cfg.lora.rank}"
    return None


def resume(engine, directory: Path) -> tuple[str, dict] | None:
    """Load the newest checkpoint under `directory` whose files check out, restoring its RNG states;
    (tag, state), or None when there is no checkpoint at all.

    A damaged checkpoint (a file that does not match its manifest, a truncated policy.safetensors, a missing or
    unreadable DeepSpeed file, or one DeepSpeed fails to load) is skipped with a warning that names the file. When
    checkpoints exist but none is usable, this raises rather than start afresh over the run's results.
    """
    directory = Path(directory)
    skipped = []
    for tag, state in complete_newest_first(directory, warn=True):
        problem = problem_with(directory / tag, state) or _lora_mismatch(engine, state)
        if problem is None:
            try:
                engine.load(str(directory), tag)
            except Exception as e:  # corrupt inside: DeepSpeed's own reader says so, without the path
                if mismatch := model_mismatch(e):
                    raise RuntimeError(f"learner.resume=true: checkpoint {directory / tag} does not match this model "
                                       f"({mismatch}); the checkpoint is intact: resume with the run's own model "
                                       f"settings (its config.yaml), or start a new run (name=...)") from e
                problem = f"{directory / tag}: DeepSpeed could not load it ({storage.reason(e)})"
        if problem is None:
            restore_rng(state["rng"])
            if skipped:
                log.warning("checkpoints: resumed from %s, the newest usable checkpoint", tag)
            return tag, state
        log.warning("checkpoints: skipping %s: %s", tag, problem)
        skipped.append(problem)
    if skipped:
        raise RuntimeError(f"learner.resume=true: no usable checkpoint under {directory} ({'; '.join(skipped)}); "
                           "remove the damaged ones, or start afresh under a new name")
    return None
