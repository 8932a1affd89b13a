"""The whole loop on a CUDA GPU: the DeepSpeed learner on NCCL and hf actors generating on the GPU.
Skips cleanly without CUDA (the `gpu` marker)."""

from __future__ import annotations

import pytest
from procs import metrics, summary

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_async_job_trains_on_the_gpu(run_job):
    run = run_job("actors.device=cuda", "steps=40", name="gpu-async")
    recs = metrics(run)
    assert len(recs) == 40 and summary(run)["reconciliation"]["balanced"]
    assert "training on cuda" in (run / "logs" / "learner.log").read_text()


def test_strict_job_on_the_gpu_passes_its_own_on_policy_check(run_job):
    run = run_job("on_policy=strict", "actors.device=cuda", "steps=15", name="gpu-strict")
    recs = metrics(run)
    assert len(recs) == 15 and all(r["lag_max"] == 0 for r in recs)
    print("max |ratio - 1| on the GPU:", max(r["is_ratio_max_abs_dev"] for r in recs))
