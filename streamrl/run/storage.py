"""A full disk is one clear line: which path could not be written, and that the disk is full.

Writers of a run's files (checkpoints, metrics.jsonl, summary.json) turn a failed write into
`DiskFull` when the filesystem is out of space. PyTorch's zip writer (DeepSpeed's checkpoints)
reports a full disk as `RuntimeError: [enforce fail at inline_container.cc] . unexpected pos`,
without an errno, so the free space of the filesystem decides there.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

LOW_SPACE_BYTES = 1 << 20  # below this a failed write is put down to the disk being full


class DiskFull(OSError):
    """A run's file could not be written because its filesystem is full; the message says which."""

    def __init__(self, path: str | Path, what: str = "", then: str = ""):
        """what: the kind of file ("checkpoint"); then: what was done about it, as a clause."""
        self.path = Path(path)
        super().__init__(errno.ENOSPC, f"disk full (No space left on device) writing {what + ' ' if what else ''}"
                         f"{self.path}{_free_text(self.path)}{'; ' + then if then else ''}")

    def __str__(self) -> str:
        return self.strerror


def _free_text(path: Path) -> str:
    free = free_bytes(path)
    return f"; {free / 2**20:.1f} MiB free on that filesystem" if free is not None else ""


def free_bytes(path: str | Path) -> int | None:
    """Free bytes on the filesystem holding `path` (or its nearest existing parent); None if unknown."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def is_disk_full(exc: BaseException | None, path: str | Path | None = None) -> bool:
    """Whether `exc` (or an exception it was raised from) means the disk is full."""
    seen = set()
    e = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, DiskFull):
            return True
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(e):
            return True
        e = e.__cause__ or e.__context__
    if isinstance(exc, (OSError, RuntimeError)) and path is not None:
        free = free_bytes(path)
        return free is not None and free < LOW_SPACE_BYTES
    return False


def reason(exc: BaseException) -> str:
    """One line for summary.json and the terminal: our own errors as they are, others with their type."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, DiskFull) or type(exc).__module__.startswith("streamrl"):
        return text or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
