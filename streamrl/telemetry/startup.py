"""Start-up phases: when each process passed each point on its way to the first step.

Every process of a run (the `streamrl run` launcher, the learner, each actor) marks the points it
passes with wall-clock times, logs one line with the phases' durations once it is up (a learner
at its first step, an actor once its first group is sent) and writes them to
RUN_DIR/logs/startup-<who>.json. `streamrl bench startup` reads those files, so its figure is what
every run records, not a separately instrumented path.

A child's clock starts when the launcher spawned it (STREAMRL_SPAWNED_AT), else when the process
started (from /proc), else at the first mark; the launcher's starts with its own process.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

SPAWNED_AT = "STREAMRL_SPAWNED_AT"

PHASES = {
    # mark: what the time up to it (from the previous mark) was spent on
    "imports": "interpreter start and module imports (torch, zmq, msgspec)",
    "model": "model and tokenizer built",
    "engine": "DeepSpeed engine built (deepspeed imported, process group, optimizer)",
    "ready": "sockets bound and version 0 published (learner) / backend and sockets up (actor)",
    "first_weights": "version 0 received and loaded (actor)",
    "first_group": "first group sent (actor) / first batch of groups received (learner)",
    "first_step": "first optimizer step done (learner)",
    "configured": "config loaded and checked (launcher)",
    "spawned": "learner and actors started (launcher)",
}


def process_started_at() -> float | None:
    """This process's start as epoch seconds (10 ms resolution), from /proc; None where unreadable."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, in clock ticks since boot
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        started = time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    # /proc/uptime virtualised apart from starttime (some containers): the result is meaningless.
    return started if time.time() - 3600 < started <= time.time() + 0.05 else None


class Phases:
    """Marks for one process (`who`: "run", "learner", "actor-0", ...)."""

    def __init__(self, who: str, started_at: float | None = None):
        self.who = who
        spawned = os.environ.get(SPAWNED_AT)
        if started_at is None and spawned:
            try:
                started_at = float(spawned)
            except ValueError:
                started_at = None
        self.marks: dict[str, float] = {"start": started_at or process_started_at() or time.time()}
        self.cpu: dict[str, float] = {"start": 0.0}
        """CPU seconds this process had used at each mark (user + system; a forked child starts at 0):
        what the phases cost apart from waiting for the cores, which a loaded machine inflates."""
        self.written = False

    def mark(self, name: str) -> None:
        """The time `name` was reached; the first mark of a name counts."""
        assert name in PHASES, name
        if name not in self.marks:
            self.marks[name] = time.time()
            self.cpu[name] = time.process_time()

    def durations(self) -> dict[str, float]:
        """Seconds of each phase (from the mark before it) and `total` (start to the last mark)."""
        out, items = {}, sorted(self.marks.items(), key=lambda kv: kv[1])
        for (_, t0), (name, t1) in zip(items, items[1:]):
            out[name] = round(t1 - t0, 4)
        out["total"] = round(items[-1][1] - items[0][1], 4)
        return out

    def done(self, run_dir: Path | str, log: logging.Logger | None = None) -> None:
        """Log the phases and write RUN_DIR/logs/startup-<who>.json (once; a failure to write is logged)."""
        if self.written:
            return
        self.written = True
        d = self.durations()
        if log is not None:
            log.info("start-up %.2f s: %s", d["total"],
                     ", ".join(f"{k} {v:.2f} s" for k, v in d.items() if k != "total"))
        try:
            path = Path(run_dir) / "logs" / f"startup-{self.who}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"who": self.who, "marks": self.marks, "cpu": self.cpu, "durations": d}) + "\n")
        except OSError as e:
            (log or logging.getLogger("streamrl")).warning("could not write the start-up record: %s", e)


def read(run_dir: Path | str) -> dict[str, dict]:
    """Every start-up record of a run, by who."""
    out = {}
    for path in sorted((Path(run_dir) / "logs").glob("startup-*.json")):
        rec = json.loads(path.read_text())
        out[rec["who"]] = rec
    return out
