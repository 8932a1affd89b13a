"""Multi-layer GRPO end to end: layer-2 groups flow through the same gate in async and strict runs,
and every step records Acc@t1, Acc@t2 and the deltas."""

from __future__ import annotations

import pytest
from procs import FREE_PORTS, REPO, metrics, streamrl, summary

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


@pytest.mark.long
def test_layer2_groups_train_beside_every_layer1_group_at_the_papers_batch_shape(tmp_path):
    """configs/mgrpo/tiny-paper-shape.yaml: strict, 4 layer-1 groups per actor and version (the paper's 32 over 8
    actors, here 8 over 2), 8 prompts per call, G 8. Every step trains its 8 layer-1 groups and, beside them, the
    layer-2 group of every verified correction of their responses: a step whose layer-1 samples show k verified
    corrections trains exactly k layer-2 groups (nothing between verifier and learner drops or displaces them)."""
    proc = streamrl("run", str(REPO / "configs" / "mgrpo" / "tiny-paper-shape.yaml"), "name=shape", "steps=60",
             f"run_dir={tmp_path / 'runs'}", "monitoring.learner_port=0", "monitoring.actor_port=0", *FREE_PORTS,
             cwd=tmp_path, timeout=300)
    run = tmp_path / "runs" / "shape"
    recs = metrics(run)
    assert len(recs) == 60 and all(r["lag_max"] == 0 for r in recs)
    for r in recs:   # 8 layer-1 groups of 8, and one layer-2 group of 8 per verified correction (acc_t2 of 64 pairs)
        assert r["samples"] == 64 + 8 * r["layer2_groups"], r
        assert r["layer2_groups"] == round(r["acc_t2"] * 64), r
    cover = summary(run)["mgrpo_layer2"]
    assert cover["first_correction_step"] is not None and cover["first_correction_step"] <= 30, cover
    assert cover["steps_since"] >= 30 and cover["share"] > 0.5, cover
    assert max(r["layer2_groups"] for r in recs) > 4   # more than the old half-of-the-budget share could hold
    assert "layer2_uneven_ranks" not in summary(run)["groups_dropped"]
    assert (f"layer 2 trained on {cover['steps_with_layer2']} of the {cover['steps_since']} steps from the first "
            f"verified correction (step {cover['first_correction_step']}) on") in proc.stdout
