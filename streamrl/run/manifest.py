"""A checkpoint's manifest: the SHA-256 and size of every file in its folder, written last, checked before use.

The learner writes `<tag>/manifest.json` after every other file of the checkpoint (streamrl.json and
data_cursor.json included), to a temporary name and renamed, and streamrl.json says a manifest follows
(`"manifest": "manifest.json"`). Resume, `streamrl eval` and `streamrl export` check every file it lists
(`problem`) before they load anything, and fall back to the previous complete checkpoint past one that fails,
saying which file and why. A checkpoint written before checkpoints carried a manifest (its streamrl.json does
not name one) is accepted with a warning: its files get the cheap checks only (whole safetensors, zip archives,
JSON that parses), which catch truncation but not a flipped byte.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import os
from pathlib import Path

log = logging.getLogger("streamrl.run.checkpoints")

MANIFEST = "manifest.json"
_BLOCK = 8 << 20  # hashlib releases the GIL on blocks this large: files hash in parallel on threads
_warned: set[Path] = set()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def _hash_all(paths: list[Path]) -> list[str]:
    """SHA-256 of each file, several at a time (a ZeRO checkpoint holds a file per rank)."""
    if len(paths) < 2:
        return [sha256(p) for p in paths]
    with concurrent.futures.ThreadPoolExecutor(min(4, len(paths), os.cpu_count() or 1)) as pool:
        return list(pool.map(sha256, paths))


def entries(folder: Path) -> dict:
    """The manifest of `folder` as it is on disk now: {"files": {relative path: {"sha256", "bytes"}}}, every file
    under it but the manifest itself and temporary files."""
    folder = Path(folder)
    paths = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST and not p.name.endswith(".tmp"))
    return {"format": 1, "files": {p.relative_to(folder).as_posix(): {"sha256": digest, "bytes": p.stat().st_size}
                                   for p, digest in zip(paths, _hash_all(paths))}}


def problem(folder: Path, state: dict) -> str | None:
    """What is wrong with the files of checkpoint `folder` (whose streamrl.json reads `state`) by its manifest,
    naming the file, or None. A checkpoint whose streamrl.json names no manifest (an older version's) is None, said
    once: the caller's cheap checks are all it gets."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not state.get("manifest"):
        if folder not in _warned:
            _warned.add(folder)
            log.warning("checkpoints: %s was written before checkpoints carried a manifest of SHA-256 sums: "
                        "accepted, its files checked for truncation only", folder)
        return None
    try:
        files = json.loads(path.read_text())["files"]
    except FileNotFoundError:
        return f"{path}: missing (the save stopped before the manifest, written last, or it was removed)"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{path}: unreadable or not a manifest ({e})"
    present = []
    for name, entry in files.items():
        p = folder / name
        try:
            size = p.stat().st_size
        except OSError:
            return f"{p}: missing (the manifest lists it)"
        if size != entry["bytes"]:
            how = "truncated" if size < entry["bytes"] else "rewritten"
            return f"{p}: {how} ({size} bytes, the manifest says {entry['bytes']})"
        present.append((p, entry["sha256"]))
    for (p, want), got in zip(present, _hash_all([p for p, _ in present])):
        if got != want:
            return f"{p}: its SHA-256 differs from the manifest's (the file is damaged)"
    return None
