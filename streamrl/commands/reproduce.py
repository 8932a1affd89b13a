"""`streamrl reproduce`: the paper's GRPO / static / CoRPO comparison on a laptop.

Trains the three estimators on the tiny CPU model and a built-in ordinal task with the same
seeds and steps, then writes the Figure-2-style plot (`streamrl.commands.plots`) and a table that checks
the paper's three observations against what these runs measured, and says so when one fails.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from streamrl import config as config_lib
from streamrl.commands import options, plots
from streamrl.run import jsonfiles

ESTIMATORS = ("grpo", "static", "corpo")
EARLY, LATE = 0.2, 0.3  # share of the run read as "early" (first) and "late" (last)


def _window(run: plots.Run, start: float, end: float, num: str, den: str) -> float:
    """Σ num / Σ den over the steps in [start, end) of the run (fractions of its length)."""
    n = len(run.records)
    recs = run.records[int(start * n):max(int(start * n) + 1, int(end * n))]
    top, bottom = sum(r[num] for r in recs), sum(r[den] for r in recs)
    return top / bottom if bottom else float("inf") if top else float("nan")


def window_r_count(run: plots.Run, start: float, end: float) -> float:
    """Σ#{A > 0} / Σ#{A < 0} over the steps in [start, end) of the run."""
    return _window(run, start, end, "adv_pos", "adv_neg")


def window_r_loss(run: plots.Run, start: float, end: float) -> float:
    """Σ|L+| / Σ|L−| over the steps in [start, end) of the run (not a mean of the steps' ratios)."""
    return _window(run, start, end, "loss_pos_sum", "loss_neg_sum")


def measure(run: plots.Run) -> dict:
    failed_pos = [r["failed_positive_fraction"] for r in run.records]
    summary = json.loads((run.path / "summary.json").read_text()) if (run.path / "summary.json").is_file() else {}
    return {
        "estimator": run.estimator,
        "steps": len(run.records),
        "reward_first_10pct": summary.get("reward_first_10pct"),
        "reward_last_10pct": summary.get("reward_last_10pct"),
        "failed_positive_mean": sum(failed_pos) / len(failed_pos),
        "failed_positive_max": max(failed_pos),
        "r_count_early": window_r_count(run, 0.0, EARLY),
        "r_count_late": window_r_count(run, 1 - LATE, 1.0),
        "r_loss_early": window_r_loss(run, 0.0, EARLY),
        "r_loss_late": window_r_loss(run, 1 - LATE, 1.0),
    }


def observations(m: dict[str, dict]) -> list[tuple[str, bool, str]]:
    """The paper's claims, each with whether these runs show it and the numbers behind the verdict."""
    g, s, c = m["grpo"], m["static"], m["corpo"]
    return [
        ("GRPO reinforces failed samples; static and CoRPO never do",
         g["failed_positive_max"] > 0 and s["failed_positive_max"] == 0 and c["failed_positive_max"] == 0,
         f"max failed-positive fraction: grpo {g['failed_positive_max']:.3f}, static {s['failed_positive_max']:.3f}, "
         f"corpo {c['failed_positive_max']:.3f}"),
        (f"early r_count (first {EARLY:.0%} of steps) below 1 for static and CoRPO",
         s["r_count_early"] < 1 and c["r_count_early"] < 1,
         f"static {s['r_count_early']:.2f}, corpo {c['r_count_early']:.2f} (grpo {g['r_count_early']:.2f})"),
        (f"static's r_count rises later (last {LATE:.0%} vs first {EARLY:.0%}) while CoRPO's stays below static's",
         s["r_count_late"] > s["r_count_early"] and c["r_count_late"] < s["r_count_late"],
         f"static {s['r_count_early']:.2f} → {s['r_count_late']:.2f}, "
         f"corpo {c['r_count_early']:.2f} → {c['r_count_late']:.2f}"),
    ]


def table(m: dict[str, dict]) -> str:
    def f(v):
        return "-" if v is None else f"{v:.3f}" if abs(v) != float("inf") else "inf"

    lines = ["| estimator | reward, first 10% → last 10% | failed-positive fraction, mean (max) "
             f"| r_count, first {EARLY:.0%} | r_count, last {LATE:.0%} | r_loss, first {EARLY:.0%} "
             f"| r_loss, last {LATE:.0%} |", "|---|---|---|---|---|---|---|"]
    for e in ESTIMATORS:
        x = m[e]
        lines.append(f"| {e} | {f(x['reward_first_10pct'])} → {f(x['reward_last_10pct'])} "
                     f"| {f(x['failed_positive_mean'])} ({f(x['failed_positive_max'])}) "
                     f"| {f(x['r_count_early'])} | {f(x['r_count_late'])} "
                     f"| {f(x['r_loss_early'])} | {f(x['r_loss_late'])} |")
    lines += ["", "| the paper's observation | seen here | measured |", "|---|---|---|"]
    lines += [f"| {claim} | {'yes' if ok else '**no**'} | {why} |" for claim, ok, why in observations(m)]
    return "\n".join(lines) + "\n"


def report(run_dirs: dict[str, Path], out: Path) -> dict:
    """Plot and table from finished runs (one per estimator); writes out/{table.md, reproduce.json, *.png}."""
    runs = {e: plots.Run(d) for e, d in run_dirs.items()}
    m = {e: measure(r) for e, r in runs.items()}
    out.mkdir(parents=True, exist_ok=True)
    pngs = plots.plot(list(run_dirs.values()), out)
    (out / "table.md").write_text(table(m))
    result = {"runs": m, "observations": [{"claim": c, "seen": ok, "measured": why} for c, ok, why in observations(m)],
              "figures": [str(p) for p in pngs]}
    jsonfiles.write(out / "reproduce.json", result)
    return result


DEFAULT_STEPS = 500  # the tiny job's 300 steps end just as static and CoRPO part ways


def run(config_path: str | None, overrides: list[str], out: str) -> int:
    """Train the three estimators one after another (same seed, steps and config), then report."""
    from streamrl.commands import launch

    out_dir = Path(out)
    dirs = {}
    for e in ESTIMATORS:
        cfg = config_lib.load(config_path, [f"steps={DEFAULT_STEPS}", *overrides, f"advantage.estimator={e}",
                                            f"name=reproduce-{e}", f"run_dir={out_dir}"])
        print(f"streamrl reproduce: training {e} ({cfg.steps} steps, seed {cfg.seed})", flush=True)
        if rc := launch.run(cfg):
            return rc
        dirs[e] = cfg.run_path
    result = report(dirs, out_dir)
    print((out_dir / "table.md").read_text(), end="")
    print(f"streamrl reproduce: figures {', '.join(result['figures'])}")
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("reproduce", help="train GRPO, static and CoRPO alike; write the paper's plot and table")
    options.add_config(p)
    p.add_argument("--out", default="runs/reproduce", help="folder for the three runs, figures and table")


def main(args: argparse.Namespace) -> int:
    if (loaded := options.load(args)) is None:  # a bad config fails before the first of three runs
        return 2
    path, overrides, _ = loaded
    return run(path, overrides, args.out)
