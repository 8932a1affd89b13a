"""`streamrl bench time-to-target`: which `max_staleness` gets the tiny job to a reward target soonest?

Actors that may run further ahead of the learner wait less, and train it on staler groups: more steps per
second, less learning per step. This bench runs the whole job (`tinyruns`: the real command, 2 actors + the
learner on 2 cores of their own per run) at each `max_staleness` value and seed and reports the wall time
(metrics.jsonl's `elapsed_s`) at which the reward's rolling mean over WINDOW steps first reaches `target`. The
reference, measured in the same run, is the project's default `max_staleness`: `ratio_to_default` below 1 is a
value that gets there sooner. A run that never reaches the target counts as its full wall time and is reported
as not reached.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from streamrl.bench import tinyruns

VALUES = (1, 2, 4, 8)
TARGET, WINDOW = 0.75, 10
STEPS, SHORT_STEPS = 600, 20


def time_to(records: list[dict], target: float, window: int = WINDOW) -> float | None:
    """Seconds (the learner's elapsed_s) at the first step whose rolling reward reaches target; None if none."""
    rec = first_reaching(records, target, window)
    return None if rec is None else rec.get("elapsed_s")


def first_reaching(records: list[dict], target: float, window: int = WINDOW) -> dict | None:
    """The record of the first step whose rolling reward (over `window` steps) reaches target; None if none."""
    curve = tinyruns.rolling([r["reward_mean"] for r in records], window)
    return next((rec for rec, value in zip(records, curve) if value >= target), None)


def time_to_target(short: bool = False, values: list[int] | None = None, seeds: int | None = None,
                   steps: int | None = None, jobs: int | None = None, cores_per_run: int = 2,
                   target: float | None = None, timeout_s: float | None = None, out: str | None = None,
                   overrides: list[str] | None = None) -> list[dict]:
    """One row per max_staleness value: seeds, runs that reached the target, mean seconds to it (a run that did
    not counts its whole wall time), and the ratio to the default's mean. short: two 20-step runs, target 0."""
    from streamrl.config import Config

    default = Config().max_staleness
    values = sorted(set(values or ([default] if short else VALUES)) | {default})
    seeds, steps = seeds or (1 if short else 3), steps or (SHORT_STEPS if short else STEPS)
    target = target if target is not None else (0.0 if short else TARGET)
    # seed-major: a sweep cut short still has every value at the first seeds
    specs = [(f"ms{v}-seed{s}", [f"max_staleness={v}", f"seed={s}", f"steps={steps}", *(overrides or [])])
             for s in range(seeds) for v in values]
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="streamrl-ttt-") as tmp:
        done = tinyruns.run_all(specs, Path(tmp), cores_per_run=cores_per_run, jobs=jobs, timeout_s=timeout_s)
    runs = []
    for v in values:
        for s in range(seeds):
            r = done[f"ms{v}-seed{s}"]
            recs = r["records"]
            t = time_to(recs, target)
            at = first_reaching(recs, target)
            runs.append({"max_staleness": v, "seed": s, "exit": r["rc"], "steps": len(recs), "reached": t is not None,
                         "step_at_target": None if at is None else at["step"],
                         "seconds": t if t is not None else (recs[-1]["elapsed_s"] if recs else None),
                         "steps_per_s": len(recs) / recs[-1]["elapsed_s"] if recs and recs[-1]["elapsed_s"] else None,
                         "lag_mean": statistics.mean(x.get("lag_mean", 0.0) for x in recs) if recs else None})
    means = {v: statistics.mean(x["seconds"] for x in runs if x["max_staleness"] == v and x["seconds"] is not None)
             if any(x["seconds"] is not None for x in runs if x["max_staleness"] == v) else None for v in values}
    rows = [{"bench": "time-to-target", "max_staleness": v, "default": v == default, "target": target,
             "seeds": seeds, "reached": sum(x["reached"] for x in mine), "seconds_mean": means[v],
             "per_seed": [None if x["seconds"] is None else round(x["seconds"], 1) for x in mine],
             "steps_per_s": statistics.mean(x["steps_per_s"] for x in mine if x["steps_per_s"])
             if any(x["steps_per_s"] for x in mine) else None,
             "ratio_to_default": means[v] / means[default] if means[v] and means[default] else None}
            for v in values for mine in [[x for x in runs if x["max_staleness"] == v]]]
    if out:
        tinyruns.write(out, "time_to_target", {"values": values, "seeds": seeds, "steps": steps, "target": target,
                                               "cores_per_run": cores_per_run, "overrides": overrides or []},
                       t0, rows, runs)
    return rows
