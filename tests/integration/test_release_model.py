"""The release-shaped Qwen3 folder (151,936-row vocabulary, byte-level BPE, chat template, two end
tokens) trains strictly on-policy end to end: learner and actor load it from model.path."""

from __future__ import annotations

import pytest
from procs import FREE_PORTS, metrics, streamrl, summary

pytestmark = pytest.mark.slow


@pytest.mark.long
def test_a_release_shaped_folder_trains_strictly_on_policy_to_the_end(release_model, tmp_path):
    # fp32: bf16 matmuls over this vocabulary are ~17x slower on these CPUs. A small batch keeps it short,
    # micro-batches of 64 tokens (2-3 rows) make the step accumulate; demand_after_s is raised because a
    # first generate call on this vocabulary is slow, not missing.
    streamrl("run", f"model.path={release_model}", "on_policy=strict", "steps=2", "learner.batch_groups=2",
             "actors.num=1", "learner.demand_after_s=60", "learner.micro_batch_tokens=64", "name=release",
             f"run_dir={tmp_path / 'runs'}", "monitoring.learner_port=0", "monitoring.actor_port=0", *FREE_PORTS,
             cwd=tmp_path, timeout=600)
    run = tmp_path / "runs" / "release"
    recs = metrics(run)
    assert [r["step"] for r in recs] == [0, 1]
    for r in recs:
        assert r["lag_max"] == 0 and r["optimizer_steps"] == 1 and r["is_ratio_max_abs_dev"] < 1e-3
    assert summary(run)["groups_used"] == 2 * 2
    actor_log = (run / "logs" / "actor-0.log").read_text()
    assert "prompts_too_long': 0" in actor_log
