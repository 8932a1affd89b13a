"""The tiny job with delta weight versions (transport.weights_delta=on): it trains as it does with full versions,
most versions cross as deltas, and summary.json reports bytes per version for full and delta versions apart."""

from __future__ import annotations

import re

import pytest
from procs import metrics, summary

pytestmark = pytest.mark.slow


@pytest.mark.long
def test_the_tiny_job_trains_with_delta_weight_versions_and_reports_their_bytes_apart(run_job):
    run = run_job("transport.weights_delta=on", "transport.weights_delta_full_every=10", "steps=150", name="delta")
    s = summary(run)
    assert s["learner_version"] == 150 and not s["stopped_early"]
    assert s["reconciliation"]["balanced"] and s["weight_requests_rejected"] == {}
    full, deltas = s["weights_full_versions"], s["weights_delta_versions"]
    assert full >= 150 // 10 and deltas >= 150 * 0.8, (full, deltas)  # the first, every 10th, any an actor asked for
    assert 0 < s["weights_delta_bytes_per_version"] < s["weights_full_bytes_per_version"]
    rewards = [r["reward_mean"] for r in metrics(run)]
    first, last = sum(rewards[:30]) / 30, sum(rewards[-30:]) / 30
    assert last > first + 0.05, (first, last)  # it learns (the full-version run: ~0.09 -> ~0.3 by step 150)
    for i in (0, 1):
        log = (run / "logs" / f"actor-{i}.log").read_text()
        assert int(re.search(r"'delta_versions': (\d+)", log).group(1)) > 0
        rejected = re.search(r"'rejected': (\{[^}]*\})", log).group(1)
        assert "delta" not in rejected, rejected  # no delta refused on a healthy loopback run
