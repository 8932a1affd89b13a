"""`streamrl bench stability`: does the reward the tiny job reaches hold over a long run?

A probe ran the default job (copy 4×4) for 5,000 steps twice: both reached 0.99, then fell to 0.25, with
importance-ratio maxima of 48–110 around the fall. This bench runs the whole job (`tinyruns`: the real command,
2 actors + the learner on their own cores) for `steps` steps per objective and seed and reports, per run, the
reward's rolling mean (WINDOW steps): its peak, its value over the last 10% of steps, and the lowest it fell to
after the peak. The reference, measured in the same run, is the run's own peak: `final_over_peak` is what the
run kept of what it reached, and the run `held` when that is at least HELD. `--out DIR` writes every run's
curve to DIR/stability.json and DIR/stability.png.
"""

from __future__ import annotations

import re
import statistics
import tempfile
import time
from pathlib import Path

from streamrl.bench import tinyruns
from streamrl.bench.staleness import objective_overrides

STEPS, SHORT_STEPS = 5000, 40
WINDOW = 100  # steps in the rolling mean: one batch's reward moves by ±0.05 on this task
HELD = 0.9
REACHED = 0.95  # issue 46's criterion: the worst rolling mean after first reaching it stays at or above HELD


def _run_name(objective: str, seed: int) -> str:
    """A run folder's name for an objective (a loss name, a variant, or NAME@KEY=VALUE...) and seed."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", objective) + f"-seed{seed}"


def summary(records: list[dict], window: int = WINDOW) -> dict:
    """Peak, final and worst-after-peak of the rolling reward of one run's metrics records; the first step it
    reaches REACHED and the worst after it; the optimizer steps skipped for a zero gradient."""
    if not records:
        return {"steps": 0}
    curve = tinyruns.rolling([r["reward_mean"] for r in records], window)
    peak_at = max(range(len(curve)), key=curve.__getitem__)
    reached = next((i for i, v in enumerate(curve) if v >= REACHED), None)
    tail = [r["reward_mean"] for r in records[-max(1, len(records) // 10):]]
    final = statistics.mean(tail)
    return {"steps": len(records), "peak": curve[peak_at], "peak_step": records[peak_at]["step"], "final": final,
            "final_over_peak": final / curve[peak_at] if curve[peak_at] > 0 else None,
            "worst_after_peak": min(curve[peak_at:]),
            "reached_step": None if reached is None else records[reached]["step"],
            "worst_after_reached": None if reached is None else min(curve[reached:]),
            "optimizer_skipped": sum(r.get("optimizer_skipped", 0) for r in records),
            "is_ratio_max": max((r.get("is_ratio_max", 1.0) for r in records), default=1.0)}


def plot(runs: dict[str, dict], path: Path, window: int = WINDOW) -> None:
    """The rolling reward of every run against its step, one colour per objective."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    objectives = sorted({r["objective"] for r in runs.values()})
    colour = {o: f"C{i}" for i, o in enumerate(objectives)}
    fig, ax = plt.subplots(figsize=(8, 4))
    for name, r in sorted(runs.items()):
        recs = r["records"]
        ax.plot([x["step"] for x in recs], tinyruns.rolling([x["reward_mean"] for x in recs], window), lw=0.9,
                color=colour[r["objective"]], label=f"{r['objective']} seed {r['seed']}")
    ax.set_xlabel("learner step")
    ax.set_ylabel(f"batch reward, mean of {window} steps")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7, loc="center")  # the curves keep to the top and bottom: the middle is free
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def stability(short: bool = False, objectives: list[str] | None = None, seeds: int | None = None,
              steps: int | None = None, jobs: int | None = None, cores_per_run: int = 2, timeout_s: float | None = None,
              out: str | None = None, overrides: list[str] | None = None) -> list[dict]:
    """One row per run, then one per objective (runs held / runs). short: one 40-step run: proves the bench runs.
    objectives: each a loss name, a staleness bench variant or NAME@KEY=VALUE... (default: the project's default
    loss). timeout_s: a run still going then is stopped and reported on the steps it made."""
    from streamrl.config import DEFAULT_LOSS

    objectives = objectives or [DEFAULT_LOSS]
    seeds, steps = seeds or (1 if short else 3), steps or (SHORT_STEPS if short else STEPS)
    window = min(WINDOW, max(1, steps // 10))
    specs = [(_run_name(o, s), [*objective_overrides(o), f"seed={s}", f"steps={steps}", *(overrides or [])])
             for o in objectives for s in range(seeds)]
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="streamrl-stability-") as tmp:
        done = tinyruns.run_all(specs, Path(tmp), cores_per_run=cores_per_run, jobs=jobs, timeout_s=timeout_s)
    runs = {name: {"objective": o, "seed": s, **done[name]} for o in objectives for s in range(seeds)
            for name in [_run_name(o, s)]}
    rows = [{"bench": "stability", "objective": r["objective"], "seed": r["seed"], "exit": r["rc"],
             **summary(r["records"], window)} for r in runs.values()]
    for row in rows:
        row["held"] = row.get("final_over_peak") is not None and row["final_over_peak"] >= HELD
    per_objective = [{"bench": "stability", "objective": o, "runs": len(mine), "steps": steps,
                      "held": sum(r["held"] for r in mine),
                      "final_over_peak_mean": statistics.mean(r.get("final_over_peak") or 0.0 for r in mine)}
                     for o in objectives for mine in [[r for r in rows if r["objective"] == o]]]
    if out:
        d = tinyruns.write(out, "stability", {"objectives": objectives, "seeds": seeds, "steps": steps,
                                              "cores_per_run": cores_per_run, "overrides": overrides or []},
                           t0, rows + per_objective, runs)
        plot(runs, d / "stability.png", window)
    return rows + per_objective
