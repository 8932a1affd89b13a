"""`streamrl bench admission`: final-policy reward of whole runs against `max_staleness`, as a user's run meets it.

The staleness bench forces an exact lag in one process, and so bypasses what sets a real run's lag: the actors
running ahead of the learner within `max_staleness`, paced by the policy's measured drift (`max_drift`, on by
default). This bench runs the whole job (`tinyruns`: the real `streamrl run`, 2 actors and the learner on cores of
their own) on the staleness bench's tasks, at each `max_staleness` and seed, and scores each run by its final policy
(the run's last checkpoint on the staleness bench's fixed eval set: `streamrl eval`'s own evaluation), as a ratio to
the same task's strict runs (`on_policy=strict`, the same seeds), measured in the same sweep. Each row also gives
the lag the actors did run at (the mean of the learner's per-step `lag_mean`).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from streamrl.bench import staleness, tinyruns

VALUES = (2, 8, 16)
STEPS, SHORT_STEPS = 300, 8
STRICT = "strict"


def _task(task: str, data_dir: Path) -> list[str]:
    """`streamrl run`'s recipe (when the task has one) and overrides for one of the staleness bench's tasks."""
    path, extra = staleness.recipe(task, "admission bench")
    return [*([path] if path else []), *staleness.COMMON, *extra, *staleness.data_paths(task, data_dir)]


def _setting(value) -> list[str]:
    return ["on_policy=strict"] if value == STRICT else [f"max_staleness={value}"]


def admission(short: bool = False, values: list[int] | None = None, seeds: int | None = None,
              steps: int | None = None, tasks: list[str] | None = None, jobs: int | None = None,
              cores_per_run: int = 2, timeout_s: float | None = None, out: str | None = None,
              overrides: list[str] | None = None) -> list[dict]:
    """One row per task and setting (strict, then each max_staleness): seeds, the final policy's mean reward and per
    seed, its ratio to strict's, the mean lag. short: the copy task, strict and max_staleness 2, 8 steps, 1 seed."""
    tasks = tasks or (["copy"] if short else ["reverse", "chat-dataset", "copy-long"])
    settings = [STRICT, *sorted(set(values or ([2] if short else VALUES)))]
    seeds, steps = seeds or (1 if short else 3), steps or (SHORT_STEPS if short else STEPS)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="streamrl-admission-") as tmp:
        folder = Path(tmp)
        args = {t: _task(t, folder) for t in tasks}  # a task's data files written once
        # seed-major: a sweep cut short has every task and setting at the first seeds
        specs = [(f"{t}-{v}-seed{s}", [*args[t], *_setting(v), f"seed={s}", f"steps={steps}", *(overrides or [])])
                 for s in range(seeds) for t in tasks for v in settings]
        done = tinyruns.run_all(specs, folder, cores_per_run=cores_per_run, jobs=jobs, timeout_s=timeout_s)
        runs = [_scored(folder, name, done[name], overrides) for name, _ in specs]
    rows = _rows(runs, tasks, settings)
    if out:
        tinyruns.write(out, "admission", {"tasks": tasks, "values": settings[1:], "seeds": seeds, "steps": steps,
                                          "cores_per_run": cores_per_run, "overrides": overrides or []},
                       t0, rows, runs)
    return rows


def _scored(folder: Path, name: str, run: dict, overrides: list[str] | None) -> dict:
    """A run's record with its final policy's eval reward (None when it left no checkpoint)."""
    from streamrl.commands.eval_cli import offline

    task, setting, seed = name.rsplit("-", 2)
    recs = run["records"]
    final = None
    if run["rc"] == 0:
        # the run's own config (its task, the staleness bench's eval set) with the sweep's overrides
        final = offline(folder / name, list(overrides or []), out=folder / f"{name}.eval.json")["eval/reward_mean"]
    return {"task": task, "setting": setting, "seed": int(seed.removeprefix("seed")), "exit": run["rc"],
            "steps": len(recs), "final_reward": final, "wall_s": run["wall_s"],
            "lag_mean": statistics.mean(r.get("lag_mean", 0.0) for r in recs) if recs else None,
            "lag_mean_max": max((r.get("lag_mean", 0.0) for r in recs), default=None)}


def _rows(runs: list[dict], tasks: list[str], settings: list) -> list[dict]:
    rows = []
    for t in tasks:
        strict = [r["final_reward"] for r in runs if r["task"] == t and r["setting"] == STRICT
                  and r["final_reward"] is not None]
        base = statistics.mean(strict) if strict else None
        for v in settings:
            mine = [r for r in runs if r["task"] == t and r["setting"] == str(v)]
            scored = [r["final_reward"] for r in mine if r["final_reward"] is not None]
            lags = [r["lag_mean"] for r in mine if r["lag_mean"] is not None]
            mean = statistics.mean(scored) if scored else None
            rows.append({"bench": "admission", "task": t, "max_staleness": v, "seeds": len(mine),
                         "scored": len(scored), "final_reward": mean,
                         "per_seed": [None if r["final_reward"] is None else round(r["final_reward"], 3)
                                      for r in mine],
                         "ratio_to_strict": mean / base if mean is not None and base else None,
                         "lag_mean": statistics.mean(lags) if lags else None})
    return rows
