"""Process plumbing shared by actor and learner: logging and a graceful-stop flag."""

from __future__ import annotations

import logging
import signal
import sys
from typing import Callable


_early: list[dict] = []  # the stop flag catch_stop_signals set up in a child before its main loop asked for one


def catch_stop_signals(fresh: bool = False) -> None:
    """From a process's first instruction on (`streamrl run|learner|actor`, and a forked child): SIGTERM/SIGINT set
    the stop flag `stop_on_signals` will return, so a stop asked during start-up is kept, neither a traceback out of
    an import nor eaten by a launcher's handler inherited through fork. A second call keeps the flag (a stop
    already asked stays asked); fresh: a new one (a forked child, whose launcher's flag is not its own)."""
    flag = _early[0] if _early and not fresh else {"stop": 0}
    _early[:] = [flag]
    _install(flag)


def stop_asked() -> int:
    """The signal that asked this process to stop before its main loop set up its own handling, or 0."""
    return _early[0]["stop"] if _early else 0


def stop_on_signals() -> Callable[[], bool]:
    """SIGTERM/SIGINT set a flag the main loop checks between steps, so a stop is always clean. A stop that came
    earlier in a child that called `catch_stop_signals` is already set."""
    flag = _early.pop() if _early else {"stop": 0}
    _install(flag)
    return lambda: bool(flag["stop"])


def _install(flag: dict) -> None:
    def handler(signum, frame):
        flag["stop"] = signum

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


_handler: list[logging.Handler] = []  # the handler setup_logging installed, if any


def setup_logging(name: str, level: str = "INFO") -> None:
    """Log lines `TIME NAME LEVEL MESSAGE` on stderr at `level`. A second call (in a child forked by
    `streamrl run`, whose launcher set up its own) replaces the handler installed here; others' stay."""
    root = logging.getLogger()
    while _handler:
        root.removeHandler(_handler.pop())
    before = list(root.handlers)
    logging.basicConfig(
        level=level, stream=sys.stderr,
        format=f"%(asctime)s {name} %(levelname)s %(message)s", datefmt="%H:%M:%S")
    _handler.extend(h for h in root.handlers if h not in before)
    for noisy in ("DeepSpeed", "deepspeed", "transformers", "torch.distributed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
