"""The default job (README, "Install and the tiny run"): the tiny CPU model measurably learns under CoRPO."""

from __future__ import annotations

import pytest
from procs import metrics, summary

pytestmark = pytest.mark.slow


@pytest.mark.long
def test_default_job_learns_and_corpo_never_reinforces_a_failed_sample(run_job):
    run = run_job(name="default", timeout=600)
    s = summary(run)
    # Mean reward over the last 10% of steps beats the first 10% by at least 20% of the reward range.
    assert s["improvement_fraction_of_range"] >= 0.2, s
    assert s["reward_last_10pct"] - s["reward_first_10pct"] >= 0.2 * (s["reward_range"][1] - s["reward_range"][0])
    recs = metrics(run)
    assert len(recs) == s["steps"] == 300
    assert all(r["failed_positive_fraction"] == 0.0 for r in recs)
    assert max(r["lag_max"] for r in recs) <= 2
    # Paced, not discarded: the README's run dropped 12 groups as stale (one actor's groups taken a version later
    # than its budget counted on while the other filled the batch); each batch now takes each actor's share.
    assert "stale" not in s["groups_dropped"], s["groups_dropped"]
    assert s["reconciliation"]["balanced"], s["reconciliation"]
