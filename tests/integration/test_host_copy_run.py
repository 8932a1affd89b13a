"""The tiny job with every version copied whole into host memory before it is sent (transport.weights_host_copy=on,
what a learner on a GPU does by default once max_staleness lets it skip versions): strict runs stay exact, async runs
keep within their staleness bound, and summary.json says what the copies cost."""

from __future__ import annotations

import pytest
from procs import metrics, summary

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mode,max_staleness", [("strict", 0), ("async", 2), ("async", 8)])
def test_the_tiny_job_runs_with_each_version_copied_to_host_memory_before_it_is_sent(run_job, mode, max_staleness):
    run = run_job("transport.weights_host_copy=on", f"on_policy={mode}", f"max_staleness={max_staleness}", "steps=30",
                  name=f"host-copy-{mode}-{max_staleness}")
    s = summary(run)
    assert s["status"] == "finished" and s["learner_version"] == 30 and not s["stopped_early"]
    assert s["reconciliation"]["balanced"] and s["weight_requests_rejected"] == {}
    assert s["weights_host_copy_s"] > 0 and s["weights_versions_skipped"] >= 0
    records = metrics(run)
    assert len(records) == 30
    if mode == "strict":  # the actors sampled with exactly the learner's weights: the copy changed no bit
        assert all(r["lag_max"] == 0 and r["is_ratio_max_abs_dev"] < 1e-4 for r in records)
    else:
        assert max(r["lag_max"] for r in records) <= max_staleness
