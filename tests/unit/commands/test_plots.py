"""streamrl plot and the reproduce table, on hand-made run directories."""

from __future__ import annotations

import json
import math

import pytest

from streamrl.commands import plots, reproduce


def _run_dir(tmp_path, estimator, steps, pos, neg, failed_pos=0.0):
    d = tmp_path / f"reproduce-{estimator}"
    d.mkdir()
    (d / "config.yaml").write_text(f"name: reproduce-{estimator}\nadvantage:\n  estimator: {estimator}\n")
    recs = []
    for s in range(steps):
        p, n = pos(s), neg(s)
        recs.append({"step": s, "adv_pos": p, "adv_neg": n, "r_loss": (p / n) if n else None,
                     "loss_pos_sum": 0.5 * p, "loss_neg_sum": 0.5 * n,
                     "failed_positive_fraction": failed_pos, "reward_mean": s / steps, "success_rate": s / steps,
                     "census_failed_pos": failed_pos, "census_failed_nonpos": 1 - failed_pos - s / steps,
                     "census_passed_pos": s / steps, "census_passed_nonpos": 0.0})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "summary.json").write_text(json.dumps({"reward_first_10pct": 0.05, "reward_last_10pct": 0.95}))
    return d


def test_windowed_r_count_sums_counts_so_an_all_positive_step_is_not_infinite():
    assert plots.windowed_ratio([2, 3, 0, 1], [1, 0, 0, 1], window=2) == [2.0, 5.0, math.inf, 1.0]
    assert plots.windowed_ratio([1], [0], 1) == [math.inf] and math.isnan(plots.windowed_ratio([0], [0], 1)[0])


def test_r_loss_over_a_window_is_the_ratio_of_summed_losses_not_a_mean_of_ratios(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    # step 0: |L+| 9, |L-| 1 (ratio 9, one negative sample); step 1: |L+| 1, |L-| 9 (ratio 1/9, one negative)
    recs = [{"step": 0, "adv_pos": 1, "adv_neg": 1, "r_loss": 9.0, "loss_pos_sum": 9.0, "loss_neg_sum": 1.0},
            {"step": 1, "adv_pos": 1, "adv_neg": 1, "r_loss": 1 / 9, "loss_pos_sum": 1.0, "loss_neg_sum": 9.0}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    run = plots.Run(d)
    assert plots.r_loss(run, 2)[1] == pytest.approx(1.0)                    # (9 + 1) / (1 + 9)
    assert reproduce.window_r_loss(run, 0.0, 1.0) == pytest.approx(1.0)     # a weighted mean of ratios gave 4.56


def test_plot_writes_every_figure_for_several_runs(tmp_path):
    dirs = [_run_dir(tmp_path, e, 30, lambda s: s, lambda s: 30 - s) for e in ("grpo", "corpo")]
    made = plots.plot(dirs, tmp_path / "out")
    assert sorted(p.name for p in made) == ["census.png", "learning_signal.png", "rewards.png"]
    assert all(p.stat().st_size > 10_000 for p in made)


def test_plot_refuses_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        plots.plot([tmp_path], tmp_path)


def test_reproduce_table_says_which_observations_hold(tmp_path):
    dirs = {
        "grpo": _run_dir(tmp_path, "grpo", 50, lambda s: 5, lambda s: 5, failed_pos=0.2),
        "static": _run_dir(tmp_path, "static", 50, lambda s: 0 if s < 25 else 40, lambda s: 10),
        "corpo": _run_dir(tmp_path, "corpo", 50, lambda s: 0 if s < 25 else 10, lambda s: 10),
    }
    result = reproduce.report(dirs, tmp_path / "out")
    assert [o["seen"] for o in result["observations"]] == [True, True, True]
    m = result["runs"]
    assert m["static"]["r_count_early"] == 0 and m["static"]["r_count_late"] == 4.0 and m["corpo"]["r_count_late"] == 1
    assert "| grpo | 0.050 → 0.950 | 0.200 (0.200) |" in (tmp_path / "out" / "table.md").read_text()


def test_reproduce_table_reports_a_missing_observation_as_no(tmp_path):
    dirs = {e: _run_dir(tmp_path, e, 20, lambda s: 5, lambda s: 5) for e in ("grpo", "static", "corpo")}
    result = reproduce.report(dirs, tmp_path / "out")
    assert [o["seen"] for o in result["observations"]] == [False, False, False]
    assert "| **no** |" in (tmp_path / "out" / "table.md").read_text()
