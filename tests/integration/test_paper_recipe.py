"""The paper's recipe end to end: the verifier task with bucketing, dynamic filtering and rollouts,
the census and weight statistics in metrics.jsonl, and the laptop reproduction command."""

from __future__ import annotations

import json
import math
import re

import pytest
from procs import FREE_PORTS, metrics, streamrl, summary

pytestmark = pytest.mark.slow


def _actor_stats(run_dir) -> list[dict]:
    """The `done {...}` line of every actor log, parsed (actors log their stats as a Python dict)."""
    import ast

    out = []
    for log in sorted((run_dir / "logs").glob("actor-*.log")):
        m = re.search(r"done (\{.*\})", log.read_text())
        out.append(ast.literal_eval(m.group(1)))
    return out


def test_verifier_task_with_a_four_step_scale_trains_and_counts_unparseable_output(run_job):
    # The paper's reward form, -BCE = ln q, with R_min_correct at the 4-step scale's 2/3 level.
    run = run_job("task.name=code_verifier", "reward.bucket_edges=[0.3,0.6,0.9]",
                  f"advantage.r_min_correct={math.log(2 / 3)!r}", "actors.max_new_tokens=6",
                  "learner.weight_stats_every=1", "steps=6", name="verifier")
    recs = metrics(run)
    assert len(recs) == 6
    assert summary(run)["reward_range"] == pytest.approx([math.log(1e-3), 0.0])
    assert all(r["reward_mean"] <= 0 for r in recs)
    for r in recs:
        assert sum(r[k] for k in ("census_failed_pos", "census_failed_nonpos", "census_passed_pos",
                                  "census_passed_nonpos")) == pytest.approx(1.0)
        assert r["weights_l2"] > 0 and r["weights_min"] <= r["weights_median"] <= r["weights_max"]
    assert any(s["unparseable"] > 0 for s in _actor_stats(run))  # a random tiny model rarely writes a rating


def test_dynamic_rollouts_and_filtering_run_in_the_actor_and_are_counted(run_job):
    run = run_job("actors.rollout_factor=3", "actors.filter_zero_variance=true", "steps=6", name="dynamic")
    stats = _actor_stats(run)
    assert sum(s["extra_samples"] for s in stats) > 0  # early on most groups hold no correct sample
    recs = metrics(run)
    assert len(recs) == 6
    for r in recs:   # the census before filtering, beside the one after, on every step
        assert sum(r[f"census_before_{c}"] for c in ("failed_pos", "failed_nonpos", "passed_pos",
                                                     "passed_nonpos")) == pytest.approx(1.0)
    # filtered groups reach the learner on the groups sent after them (those the learner drops take theirs along)
    assert sum(r["groups_filtered"] for r in recs) <= sum(s.get("filtered_zero_variance", 0) for s in stats)
    assert summary(run)["reconciliation"]["balanced"]


@pytest.mark.long
def test_reproduce_trains_three_estimators_and_writes_the_plot_and_table(tmp_path):
    out = tmp_path / "repro"
    streamrl("reproduce", "steps=12", *FREE_PORTS, "--out", str(out), cwd=tmp_path, timeout=400)
    result = json.loads((out / "reproduce.json").read_text())
    runs = result["runs"]
    assert set(runs) == {"grpo", "static", "corpo"} and all(r["steps"] == 12 for r in runs.values())
    assert runs["static"]["failed_positive_max"] == 0 and runs["corpo"]["failed_positive_max"] == 0
    assert (out / "learning_signal.png").stat().st_size > 10_000 and "| corpo |" in (out / "table.md").read_text()
