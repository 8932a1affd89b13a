"""`streamrl run` on CPU: the learner and actors forked from a launcher that imported their common
modules once.

Each of the three processes of the tiny job otherwise spends seconds of CPU importing torch (and, for a
release model, transformers' model classes, which pull in torch._dynamo and torch.distributed.tensor),
three times over on 2 cores, before any of them can build a model. Forked from a launcher that has
imported them, a child starts with them loaded and runs `streamrl learner|actor` as its own
process exactly as an exec'd one would: its own session, log, signals and exit status, and the
launcher's death still takes it down. Each child then imports only its own role's modules (the
learner DeepSpeed; an actor never does).

Only where forking is safe: nothing in the launcher has touched CUDA (GPU runs, and learners
under torchrun, are started as fresh processes) and the launcher runs no threads of its own.
`STREAMRL_FORK=0` starts every child as a fresh process.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from streamrl.config import Config
from streamrl.run import lifecycle

ENV = "STREAMRL_FORK"


def enabled() -> bool:
    return hasattr(os, "fork") and os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def preload(cfg: Config) -> None:
    """Import, once, the modules both the learner and the actors need (never DeepSpeed, never a
    backend's engine): torch, zmq, msgspec, the tokenizer's and the model's classes: for the tiny default
    streamrl's word tokenizer and plain-torch Llama (transformers is never imported: its modeling code
    alone is 3.4 s), for a release model transformers' PreTrainedTokenizerFast and PreTrainedModel (its
    own class comes with AutoModelForCausalLM)."""
    import torch  # noqa: F401
    import zmq  # noqa: F401

    if cfg.model.path is None:
        from streamrl.models import tiny_llama, word_tokenizer  # noqa: F401
    else:
        from transformers import PreTrainedModel, PreTrainedTokenizerFast  # noqa: F401
    from streamrl.comm import codec, control, groups, wire  # noqa: F401
    from streamrl.comm.weights import subscriber  # noqa: F401


class Forked:
    """The subprocess.Popen surface the launcher uses (pid, poll, wait, send_signal, kill,
    returncode: negative for a signal) over a forked child."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its status is lost
                self.returncode = 1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(["streamrl"], timeout)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn(args: list[str], log_path: Path, env: dict[str, str], die_with_parent) -> Forked:
    """`streamrl ARGS` in a forked child, output to `log_path`, with `env` as its environment."""
    for stream in (sys.stdout, sys.stderr):  # what the launcher printed must not be printed again
        stream.flush()
    # Blocked across the fork: a stop sent to the child before it has handlers of its own waits for them, rather
    # than run the launcher's inherited handler in the child and vanish (a run that then trained to the end).
    stops = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        raise
    if pid:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        return Forked(pid)
    code = 1
    try:
        os.setsid()
        die_with_parent()
        lifecycle.catch_stop_signals(fresh=True)  # a stop from now on is kept for the learner's or actor's loop
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)  # a resume goes on after the old log
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        os.environ.clear()
        os.environ.update(env)
        for stream in (sys.stdout, sys.stderr):
            if hasattr(stream, "reconfigure"):
                stream.reconfigure(write_through=True)  # PYTHONUNBUFFERED, as the exec'd children have
        _reseed()
        set_cmdline(["streamrl", *args])
        sys.argv = ["streamrl", *args]
        runpy.run_module("streamrl", run_name="__main__")  # `python -m streamrl ARGS`: ends in SystemExit
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)  # never back into the launcher's stack


def _reseed() -> None:
    """A fork copies the launcher's random states; each child draws its own, as a fresh process does."""
    import random

    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def set_cmdline(argv: list[str]) -> bool:
    """Show `argv` as this process's command line (/proc/PID/cmdline, ps), so a forked learner or
    actor reads like the one it would have been; cut to the space the original command line had.
    Linux only; False where it could not."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: fields 48 and 49
    except (OSError, ValueError, IndexError):
        return False
    size = end - start
    if size <= 1:
        return False
    data = b"\0".join(a.encode() for a in argv)[:size - 1]
    ctypes.memmove(start, data.ljust(size, b"\0"), size)  # ends in NUL: the kernel reads no further
    return True
