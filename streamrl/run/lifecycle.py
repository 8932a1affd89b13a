"""Process plumbing shared by actor and learner: logging and a graceful-stop flag."""

from __future__ import annotations

import logging
import signal
import sys
from typing import Callable


def stop_on_signals() -> Callable[[], bool]:
    """SIGTERM/SIGINT set a flag the main loop checks between steps, so a stop is always clean."""
    flag = {"stop": False}

    def handler(signum, frame):
        flag["stop"] = True

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return lambda: flag["stop"]


def setup_logging(name: str, level: str = "INFO") -> None:
    logging.basicConfig(
        level=level, stream=sys.stderr,
        format=f"%(asctime)s {name} %(levelname)s %(message)s", datefmt="%H:%M:%S")
    for noisy in ("DeepSpeed", "deepspeed", "transformers", "torch.distributed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
