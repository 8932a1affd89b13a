"""Multi-layer GRPO end to end: layer-2 groups flow through the same gate in async and strict runs,
and every step records Acc@t1, Acc@t2 and the deltas."""

from __future__ import annotations

import pytest
from procs import metrics, summary

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mode", ["async", "strict"])
def test_mgrpo_run_records_the_five_metrics_every_step(run_job, mode):
    run = run_job(f"on_policy={mode}", "mgrpo.enabled=true", "steps=8",
                  name=f"mgrpo-{mode}")
    recs = metrics(run)
    assert len(recs) == 8
    for r in recs:
        for key in ("acc_t1", "acc_t2", "delta_t1_t2", "delta_i2c", "delta_c2i"):
            assert 0 <= abs(r[key]) <= 1, (key, r[key])
        assert r["delta_t1_t2"] == pytest.approx(r["delta_i2c"] - r["delta_c2i"])
        assert r["delta_t1_t2"] == pytest.approx(r["acc_t2"] - r["acc_t1"])
        if mode == "strict":
            assert r["lag_max"] == 0   # layer-2 groups carry their own version and pass the same gate
    assert summary(run)["reconciliation"]["balanced"]
