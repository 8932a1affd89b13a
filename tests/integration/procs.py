"""Start real streamrl processes on loopback and read what they leave in the run directory."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import zmq

from streamrl.commands.launch import free_ports  # noqa: F401  (tests pick ports the way `streamrl run` does)

REPO = Path(__file__).resolve().parents[2]
FREE_PORTS = ["transport.group_port=0", "transport.weights_port=0", "transport.weights_request_port=0",
              "transport.weight_sync_port=0"]


def streamrl(*args: str, cwd: Path, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    """Run the `streamrl` command as a user would, in its own process."""
    proc = subprocess.run([sys.executable, "-m", "streamrl", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if check and proc.returncode != 0:
        raise AssertionError(f"streamrl {' '.join(args)} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}\n"
                             f"{_logs(cwd)}")
    return proc


def _logs(cwd: Path) -> str:
    out = []
    for log in sorted(cwd.glob("runs/*/logs/*.log")):
        tail = log.read_text(errors="replace").splitlines()[-25:]
        out.append(f"--- {log.relative_to(cwd)} (tail)\n" + "\n".join(tail))
    return "\n".join(out)


def metrics(run_dir: Path) -> list[dict]:
    """The records of metrics.jsonl; polled while the learner appends, so a last line without its newline is one
    still being written, not a record (the suite once read one mid-write: JSONDecodeError at column 635)."""
    text = (run_dir / "metrics.jsonl").read_text()
    return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines() if line.strip()]


def steps_done(run_dir: Path) -> int:
    """How many steps the learner of run_dir has logged so far (0 before its first)."""
    return len(metrics(run_dir)) if (run_dir / "metrics.jsonl").exists() else 0


def probe(script: str, cwd: Path, env: dict, timeout: float = 500) -> dict:
    """Run a test module as a script in a fresh process (an engine's own, away from pytest's) and return the JSON
    its last stdout line holds."""
    proc = subprocess.run([sys.executable, script], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def spawn(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "streamrl", *args], stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@contextlib.contextmanager
def reaped(*procs: subprocess.Popen | list[subprocess.Popen]):
    """Whatever the test's outcome, no process it started outlives it (a list may grow inside)."""
    try:
        yield
    finally:
        for p in [q for item in procs for q in (item if isinstance(item, list) else [item])]:
            if p.poll() is None:
                p.kill()


def wait_for_steps(proc: subprocess.Popen, run_dir: Path, steps: int = 5, timeout: float = 180) -> None:
    """Return once the background run `proc` has logged `steps` learner steps; kill it and fail if it never does."""
    deadline = time.monotonic() + timeout
    while not ((run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= steps):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise AssertionError(f"run never got going:\n{proc.communicate()[0][-3000:]}")
        time.sleep(0.1)


def wait_steps(run_dir: Path, n: int, proc: subprocess.Popen, timeout: float = 180) -> None:
    """Return once the learner `proc` (its output in a log file) has logged `n` steps; fail if it stops or stalls."""
    deadline = time.monotonic() + timeout
    while not ((run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= n):
        assert proc.poll() is None and time.monotonic() < deadline, f"learner stopped or stalled before step {n}"
        time.sleep(0.05)


def wait_started(actor_log: Path, *alive: subprocess.Popen, timeout: float = 180) -> None:
    """Return once the actor logging to `actor_log` has its first weights and starts generating; fail if any of
    `alive` (the actor, the learner) stops first or it takes longer than `timeout`."""
    deadline = time.monotonic() + timeout

    def text() -> str:
        return actor_log.read_text(errors="replace") if actor_log.exists() else ""

    while "starting at policy version" not in text():
        assert all(p.poll() is None for p in alive) and time.monotonic() < deadline, \
            f"{actor_log.name}: no start in sight\n{text()[-3000:]}"
        time.sleep(0.1)


def children_of_run(run_dir: Path) -> list[int]:
    """Processes started for the run in run_dir (their command line names its config.yaml)."""
    marker = str(run_dir / "config.yaml")
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker in (d / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


def rss_mb(pid: int) -> float:
    """Resident memory of a process, in MB."""
    return int(re.search(r"VmRSS:\s+(\d+) kB", open(f"/proc/{pid}/status").read()).group(1)) / 1024


def send_raw(ctx: zmq.Context, kind: int, addr: str, messages: list[list[bytes]]) -> None:
    """Send raw frames from a fresh socket of `kind` (fuzzing, garbage): nothing streamrl encoded."""
    s = ctx.socket(kind)
    s.setsockopt(zmq.LINGER, 2000)
    s.connect(addr)
    time.sleep(0.3)  # let the connection come up so nothing is dropped before it exists
    for frames in messages:
        s.send_multipart(frames)
    s.close()
