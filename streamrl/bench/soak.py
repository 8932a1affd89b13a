"""`streamrl bench soak`: the default job for many steps, each process's resident memory sampled as it trains.

Runs the real command (`python -m streamrl run`, the tiny job, free ports) for STREAMRL_SOAK_STEPS steps (20,000;
300 with --short), samples every process's RSS (/proc/PID/status VmRSS) and the learner's step (metrics.jsonl)
about once a second, and reports per process the least-squares slope of RSS against steps, per 1,000 steps, after
a warm-up (the first 10% of steps: allocator pools and caches fill there). The reference, measured in the same run,
is the process's own RSS at the end of the warm-up: `slope_fraction_per_1k` = slope / that RSS. A leak shows as a
slope that stays positive however long the run; a bound (`SLOPE_BOUND_MB_PER_1K`) is checked and reported.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SLOPE_BOUND_MB_PER_1K = 2.0  # a process growing faster than this per 1,000 steps is reported as leaking
WARMUP_FRACTION = 0.1


def slope_per_1k(samples: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of (step, MB) samples, in MB per 1,000 steps; None with fewer than 3 distinct steps."""
    if len({s for s, _ in samples}) < 3:
        return None
    n = len(samples)
    mx, my = sum(s for s, _ in samples) / n, sum(m for _, m in samples) / n
    sxx = sum((s - mx) ** 2 for s, _ in samples)
    sxy = sum((s - mx) * (m - my) for s, m in samples)
    return 1000 * sxy / sxx


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _processes(config_path: str) -> dict[str, int]:
    """The run's learner and actors by name: their command lines name its config.yaml."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if config_path in argv:
            if "learner" in argv:
                found["learner"] = int(d.name)
            elif "actor" in argv and "--index" in argv:
                found[f"actor-{argv[argv.index('--index') + 1]}"] = int(d.name)
    return found


class _Lines:
    """Lines in a growing file, reading only what was appended since the last call."""

    def __init__(self, path: Path):
        self.path, self.pos, self.count = path, 0, 0

    def __call__(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                chunk = f.read()
        except OSError:
            return self.count
        self.pos += len(chunk)
        self.count += chunk.count(b"\n")
        return self.count


def soak(short: bool = False) -> list[dict]:
    steps = int(os.environ.get("STREAMRL_SOAK_STEPS", 300 if short else 20_000))
    with tempfile.TemporaryDirectory(prefix="streamrl-soak-") as tmp:
        run = Path(tmp) / "soak"
        cmd = [sys.executable, "-m", "streamrl", "run", f"run_dir={tmp}", "name=soak", f"steps={steps}",
               "transport.group_port=0", "transport.weights_port=0", "transport.weights_request_port=0",
               "monitoring.learner_port=0", "monitoring.actor_port=0", "log_every=1000000"]
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=tmp)
        samples: dict[str, list[tuple[int, float]]] = {}
        config, steps_done = str(run / "config.yaml"), _Lines(run / "metrics.jsonl")
        try:
            while proc.poll() is None:
                step = steps_done()
                for name, pid in _processes(config).items():
                    if (mb := _rss_mb(pid)) is not None and step:
                        samples.setdefault(name, []).append((step, mb))
                time.sleep(1.0)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        wall = time.monotonic() - t0
        done = steps_done()
    warm = int(steps * WARMUP_FRACTION)
    rows = []
    for name, got in sorted(samples.items()):
        after = [(s, m) for s, m in got if s >= warm]
        slope = slope_per_1k(after)
        start = after[0][1] if after else None
        rows.append({"bench": "soak", "process": name, "steps": done, "wall_s": wall, "samples": len(after),
                     "rss_after_warmup_mb": start, "rss_end_mb": after[-1][1] if after else None,
                     "rss_max_mb": max((m for _, m in after), default=None),
                     "slope_mb_per_1k_steps": slope,
                     "slope_fraction_per_1k": slope / start if slope is not None and start else None,
                     "within_bound": slope is not None and slope <= SLOPE_BOUND_MB_PER_1K})
    return rows
