"""Whole runs of the real `streamrl run` side by side, each pinned to cores of its own: the harness behind
`streamrl bench stability` and `streamrl bench time-to-target`.

Unlike the staleness bench (one process, a forced lag), these measure the whole loop as a user runs it: the
actors, the learner, their queues and their timing. Each run is `python -m streamrl run` on free ports in a
folder of its own; its processes inherit the CPU affinity the run's command is started with, so `cores_per_run`
cores per run and `len(cores) // cores_per_run` runs at once give every run the same machine (2 cores: the
tiny job's documented setting).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

# What the benches read from each metrics.jsonl line; the rest of the line is dropped to keep records small.
KEYS = ("step", "reward_mean", "elapsed_s", "lag_mean", "is_ratio_max", "clipped_fraction", "truncated_fraction",
        "masked_fraction", "is_ess_fraction", "grad_norm", "optimizer_skipped")


def slots(cores_per_run: int, jobs: int | None = None) -> list[list[int]]:
    """Disjoint sets of `cores_per_run` cores out of this process's affinity: one per run that runs at once."""
    cores = sorted(os.sched_getaffinity(0))
    n = len(cores) // cores_per_run
    if n < 1:
        raise ValueError(f"{cores_per_run} cores per run, but this process may use only {len(cores)}")
    n = min(n, jobs) if jobs else n
    return [cores[i * cores_per_run:(i + 1) * cores_per_run] for i in range(n)]


def read_metrics(path: Path) -> list[dict]:
    """The metrics.jsonl lines (only KEYS); a torn last line (the run killed mid-write) is left out."""
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        out.append({k: rec[k] for k in KEYS if k in rec})
    return out


def run_all(specs: list[tuple[str, list[str]]], folder: Path, cores_per_run: int = 2, jobs: int | None = None,
            timeout_s: float | None = None, log=print) -> dict[str, dict]:
    """Run every (name, overrides) spec as `streamrl run` in `folder`, as many at once as there are slots; a run
    past `timeout_s` is killed (its metrics so far are kept). Returns name -> {rc, wall_s, killed, records}.
    A spec's overrides may start with a recipe (a YAML file: `streamrl run`'s CONFIG, which goes first)."""
    pending, running, done = list(specs), {}, {}
    free = slots(cores_per_run, jobs)
    folder.mkdir(parents=True, exist_ok=True)
    while pending or running:
        while pending and free:
            name, overrides = pending.pop(0)
            cores = free.pop(0)
            recipe = overrides[:1] if overrides and overrides[0].endswith((".yaml", ".yml")) else []
            overrides = overrides[len(recipe):]
            cmd = [sys.executable, "-m", "streamrl", "run", *recipe, f"run_dir={folder}", f"name={name}",
                   "transport.group_port=0", "transport.weights_port=0", "transport.weights_request_port=0",
                   "monitoring.learner_port=0", "monitoring.actor_port=0", *overrides]
            out = open(folder / f"{name}.out", "wb")
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=folder,
                                    preexec_fn=lambda c=cores: os.sched_setaffinity(0, c))
            running[name] = (proc, cores, time.monotonic(), out)
        time.sleep(0.5)
        for name, (proc, cores, t0, out) in list(running.items()):
            killed = timeout_s is not None and proc.poll() is None and time.monotonic() - t0 > timeout_s
            if killed:
                proc.terminate()  # `streamrl run` stops its learner and actors on SIGTERM
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            if proc.poll() is None:
                continue
            out.close()
            del running[name]
            free.append(cores)
            records = read_metrics(folder / name / "metrics.jsonl")
            done[name] = {"rc": proc.returncode, "wall_s": round(time.monotonic() - t0, 1), "killed": killed,
                          "records": records}
            log(f"  {name}: exit {proc.returncode}{' (killed at the time limit)' if killed else ''}, "
                f"{len(records)} steps in {done[name]['wall_s']:.0f} s")
    return done


def write(out: str, name: str, command: dict, t0: float, rows: list[dict], runs) -> Path:
    """DIR/<name>.json: the sweep's command, date (its start, t0) and wall time, its rows and every run; the folder."""
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.json").write_text(json.dumps(
        {"command": command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0)),
         "wall_s": round(time.time() - t0, 1), "rows": rows, "runs": runs}))
    return d


def rolling(values: list[float], window: int) -> list[float]:
    """The mean of the last `window` values at each position (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out
