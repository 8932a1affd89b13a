"""`streamrl plot RUN_DIR...`: the paper's figures from run directories, as PNG.

- learning_signal.png (Figure 2): r_count and r_loss per step, one line per run, side by side.
- rewards.png: mean reward, success rate and failed-positive fraction per step.
- census.png (Figure 1): share of samples in {failed, passed} × {A > 0, A ≤ 0}, one panel per run.
- uplift.png (Figure 3): for each run with an `uplift.json` (`streamrl uplift`), the post/pre
  probability ratio of correct solutions per initial-likelihood rank bucket.

Ratios are aggregated over a window of steps as Σ#{A > 0} / Σ#{A < 0} (r_count) and
Σ|L(A > 0)| / Σ|L(A < 0)| (r_loss, from each step's `loss_pos_sum` and `loss_neg_sum`), so a step
with no negative sample does not turn a curve into infinities.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import yaml


class Run:
    """One run directory's metrics.jsonl and config, read once."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        metrics = self.path / "metrics.jsonl"
        if not metrics.is_file():
            raise FileNotFoundError(f"{self.path}: no metrics.jsonl (is this a streamrl run directory?)")
        self.records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        if not self.records:
            raise ValueError(f"{metrics}: no steps recorded yet")
        cfg = yaml.safe_load((self.path / "config.yaml").read_text()) if (self.path / "config.yaml").is_file() else {}
        self.estimator = cfg.get("advantage", {}).get("estimator", "?")
        self.name = cfg.get("name", self.path.name)
        self.label = f"{self.estimator} ({self.name})" if self.estimator not in self.name else self.name

    def series(self, key: str) -> list[float]:
        return [math.nan if r.get(key) is None else float(r[key]) for r in self.records]

    @property
    def steps(self) -> list[int]:
        return [r["step"] for r in self.records]


def windowed_ratio(num: list[float], den: list[float], window: int) -> list[float]:
    """Σ num / Σ den over the trailing `window` steps (inf where the denominator sums to 0 and num > 0)."""
    out = []
    for i in range(len(num)):
        n, d = sum(num[max(0, i - window + 1):i + 1]), sum(den[max(0, i - window + 1):i + 1])
        out.append(n / d if d else (math.inf if n else math.nan))
    return out


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing mean over `window` steps, skipping NaN."""
    out = []
    for i in range(len(values)):
        xs = [v for v in values[max(0, i - window + 1):i + 1] if not math.isnan(v)]
        out.append(sum(xs) / len(xs) if xs else math.nan)
    return out


def r_count(run: Run, window: int) -> list[float]:
    return windowed_ratio(run.series("adv_pos"), run.series("adv_neg"), window)


def r_loss(run: Run, window: int) -> list[float]:
    """Σ|L+| / Σ|L−| over the trailing window (NaN for runs recorded before the sums were logged)."""
    return windowed_ratio(run.series("loss_pos_sum"), run.series("loss_neg_sum"), window)


def _finite_or_top(values: list[float], top: float) -> list[float]:
    """inf drawn at the top of a log axis (a step with only positive advantages), NaN left as a gap."""
    return [top if v == math.inf else v for v in values]


def learning_signal_figure(runs: list[Run], out: Path, window: int = 10) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    panels = [("r_count = #{A>0} / #{A<0}", r_count), ("r_loss = |L(A>0)| / |L(A<0)|", r_loss)]
    for ax, (title, fn) in zip(axes, panels):
        for run in runs:
            ax.plot(run.steps, _finite_or_top(fn(run, window), 1e3), label=run.label)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_yscale("log")
        ax.set_title(f"{title}  ({window}-step window)")
        ax.set_xlabel("step")
    axes[0].legend()
    return _save(fig, out / "learning_signal.png")


def rewards_figure(runs: list[Run], out: Path, window: int = 10) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [("reward_mean", "mean reward"), ("success_rate", "success rate (R ≥ R_min_correct)"),
            ("failed_positive_fraction", "failed samples with A > 0")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), sharex=True)
    for ax, (key, title) in zip(axes, keys):
        for run in runs:
            ax.plot(run.steps, smooth(run.series(key), window), label=run.label)
        ax.set_title(f"{title}  ({window}-step mean)")
        ax.set_xlabel("step")
    axes[0].legend()
    return _save(fig, out / "rewards.png")


CENSUS = [("census_failed_pos", "failed, A > 0"), ("census_failed_nonpos", "failed, A ≤ 0"),
          ("census_passed_pos", "passed, A > 0"), ("census_passed_nonpos", "passed, A ≤ 0")]


def census_figure(runs: list[Run], out: Path, window: int = 10) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 4), sharey=True, squeeze=False)
    for ax, run in zip(axes[0], runs):
        ax.stackplot(run.steps, *[smooth(run.series(k), window) for k, _ in CENSUS], labels=[t for _, t in CENSUS],
                     colors=["#d62728", "#ff9896", "#2ca02c", "#98df8a"])
        ax.set_title(run.label)
        ax.set_xlabel("step")
        ax.set_ylim(0, 1)
    axes[0][0].legend(loc="lower left", fontsize=8)
    return _save(fig, out / "census.png")


def uplift_figure(runs: list[Run], out: Path) -> Path | None:
    with_uplift = [(run, json.loads((run.path / "uplift.json").read_text()))
                   for run in runs if (run.path / "uplift.json").is_file()]
    if not with_uplift:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for run, data in with_uplift:
        buckets = data["buckets"]
        ratios = [math.nan if b["geo_mean_ratio"] is None else b["geo_mean_ratio"] for b in buckets]
        ax.plot([b["bucket"] for b in buckets], ratios, marker="o", label=run.label)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xlabel("rank bucket of the initial likelihood (0 = most likely at the start)")
    ax.set_ylabel("post / pre probability (geometric mean)")
    ax.set_title("uplift of correct solutions")
    ax.legend()
    return _save(fig, out / "uplift.png")


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def plot(run_dirs: list[str | Path], out: str | Path, window: int = 10) -> list[Path]:
    """Every figure the runs have data for; returns the PNG paths written."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("streamrl plot needs matplotlib: pip install 'streamrl[monitoring]'") from None
    runs = [Run(d) for d in run_dirs]
    out = Path(out)
    made = [learning_signal_figure(runs, out, window), rewards_figure(runs, out, window),
            census_figure(runs, out, window), uplift_figure(runs, out)]
    return [p for p in made if p is not None]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("plot", help="r_count/r_loss (paper Figure 2), rewards, census and uplift plots as PNG")
    p.add_argument("runs", nargs="+", help="run directories (runs/<name>)")
    p.add_argument("--out", default=None, help="folder for the PNGs (default: the first run directory)")
    p.add_argument("--window", type=int, default=10, help="steps per smoothing window (default 10)")


def main(args: argparse.Namespace) -> int:
    try:
        if args.window < 1:
            raise ValueError(f"--window {args.window}: must be at least 1 (steps per smoothing window)")
        made = plot(args.runs, args.out or args.runs[0], args.window)
    except (FileNotFoundError, ValueError) as e:
        print(f"streamrl plot: {e}", file=sys.stderr)
        return 2
    print("streamrl plot: wrote " + ", ".join(map(str, made)))
    return 0
