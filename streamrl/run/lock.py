"""One run, one directory: an OS file lock on `<run>/.lock`, held for the run's life.

`streamrl run` takes it before touching the run directory, and so does a `streamrl learner` started on its own
(rank 0); a learner the supervisor started finds its supervisor's pid in STREAMRL_RUN_LOCK and goes on under
that lock. `fcntl.flock` is released by the kernel when the holder dies, even by SIGKILL, so a crash never
leaves a stale lock; the file's text (pid and command line of the holder) is only there to name it in a refusal.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
from pathlib import Path

LOCK_FILE = ".lock"
HELD_BY = "STREAMRL_RUN_LOCK"  # the supervisor's pid, in its children's environment


class RunLocked(RuntimeError):
    """The run directory is locked by a live process; the message names it."""


def _holder_text(path: Path) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        text = ""
    return text or "a process that did not say which"


def holder_pid(path: Path) -> int | None:
    """The pid recorded in a lock file (None when unreadable)."""
    try:
        return int(path.read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None


class RunLock:
    """An exclusive lock on one run directory (created if missing)."""

    def __init__(self, run_path: Path):
        self.run_path = Path(run_path)
        self.path = self.run_path / LOCK_FILE
        self.fd: int | None = None
        self.made = False
        """Whether acquiring it created the run directory (`give_back` may then remove it)."""

    def acquire(self, purpose: str) -> RunLock:
        """Take the lock or raise RunLocked naming the live holder; `purpose` ("resume", "--overwrite") says
        what was refused."""
        self.made = not self.run_path.exists()
        self.run_path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise RunLocked(f"{self.run_path} is in use by a live run ({_holder_text(self.path)}); {purpose} is "
                            "refused while it runs: stop it first, or choose another name (name=...)") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} command {' '.join(sys.argv) or sys.executable}\n".encode())
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the last descriptor drops the flock
            self.fd = None


_HELD: dict[str, RunLock] = {}  # kept for the process's life: the lock goes when the process does


def take(run_path: Path, purpose: str) -> RunLock:
    """Acquire and keep the lock on `run_path` for this process's life (again after the directory was moved
    aside: the lock then follows the new, empty directory)."""
    key = str(Path(run_path).absolute())
    if (old := _HELD.pop(key, None)) is not None:
        old.release()
    _HELD[key] = RunLock(run_path).acquire(purpose)
    return _HELD[key]


def give_back(run_path: Path) -> None:
    """Undo `take` for a run stopped before it wrote anything: the lock goes, and so does the directory when taking
    the lock made it and it holds nothing else (a stop during start-up leaves no empty run behind)."""
    held = _HELD.pop(str(Path(run_path).absolute()), None)
    if held is None:
        return
    if held.made and [p.name for p in held.run_path.iterdir()] == [LOCK_FILE]:
        held.path.unlink(missing_ok=True)  # while still locked: nobody takes a lock on a file about to go
        held.release()
        held.run_path.rmdir()
    else:
        held.release()


def held_for_me(run_path: Path) -> bool:
    """Whether this process was started by the supervisor that holds the lock on `run_path`."""
    owner = os.environ.get(HELD_BY)
    return owner is not None and owner.isdigit() and holder_pid(Path(run_path) / LOCK_FILE) == int(owner)


def live_holder(run_path: Path) -> str | None:
    """Who holds the lock on `run_path` now (pid and command), or None when nobody does."""
    path = Path(run_path) / LOCK_FILE
    if not path.is_file():
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _holder_text(path)
    finally:
        os.close(fd)
    return None
