"""step.train's Step is metrics.jsonl's record: the keys (and their order) the learner loop wrote before the step
was typed, captured from a tiny run's metrics.jsonl, are the keys of `Step.record()` on a real engine's step."""

from __future__ import annotations

import json
import multiprocessing as mp

import msgspec
import pytest

# A tiny run's first metrics.jsonl line (configs/tiny.yaml, before learner/step.py existed): a step without weight
# statistics or an evaluation. The loop adds metrics_s, then the intake's accounting and elapsed_s. Added since:
# samples_unscored, episode_counts (issue 37); optimizer_skipped, step_scale, drift_per_version (issue 46).
METRICS_KEYS = [
    "step", "learner_version", "r_count", "r_loss", "loss_pos_sum", "loss_neg_sum", "adv_pos", "adv_neg", "adv_zero",
    "failed_positive_fraction", "corpo_phase_fraction", "census_failed_pos", "census_failed_nonpos",
    "census_passed_pos", "census_passed_nonpos", "reward_mean", "samples_unscored", "success_rate", "groups_filtered",
    "census_before_failed_pos", "census_before_failed_nonpos", "census_before_passed_pos",
    "census_before_passed_nonpos", "reward_std", "advantage_mean", "lag_max", "lag_mean", "lag_hist",
    "version_span_max", "inflight_fraction", "is_ratio_mean", "is_ratio_min", "is_ratio_max", "is_ratio_max_abs_dev",
    "kl_behaviour_learner", "group_kl_behaviour_learner_max", "log_ratio_abs_mean", "sample_log_ratio_abs_max",
    "clipped_fraction", "truncated_fraction", "masked_fraction", "is_ess_fraction", "loss", "grad_norm", "lr",
    "step_scale", "drift_per_version", "optimizer_steps", "optimizer_skipped", "micro_batches", "micro_batches_idle",
    "fwd_bwd_s", "backward_s", "optimizer_s", "wait_s", "batch_s", "train_s", "publish_s", "step_s", "samples",
    "tokens", "samples_per_s", "tokens_per_s", "metrics_s", "groups_received", "groups_used", "groups_dropped",
    "reward_failures", "episode_counts", "messages_rejected", "weight_requests_rejected", "weight_requests_served",
    "demands_sent", "peers_refused", "elapsed_s",
]
LOOP_EXTRAS = METRICS_KEYS[METRICS_KEYS.index("metrics_s") + 1:]  # Intake.accounting()'s keys, elapsed_s
WEIGHT_KEYS = ["weights_l1", "weights_l2", "weights_min", "weights_max", "weights_mean", "weights_median"]


def _steps(out_path: str) -> None:
    """Two steps of the tiny model's real engine, one with weight statistics; writes their records' keys. In a
    process of its own: the engine initialises torch.distributed."""
    import random

    import torch

    torch.set_num_threads(1)
    from streamrl import config, tasks
    from streamrl.comm.codec import ScoredGroup
    from streamrl.learner import step
    from streamrl.learner.engine import Engine
    from streamrl.models import model

    cfg = config.load(None, ["learner.batch_groups=2"])
    m, tok = model.build(cfg, tasks.build(cfg.task).vocabulary)
    engine = Engine(cfg, m)
    rng = random.Random(0)
    groups = [ScoredGroup.from_samples(
        prompt_id=f"p{i}", policy_version=0, actor_id="a", prompt_tokens=[5, 6, 7], completions=[[8, 9]] * 4,
        logprobs=[[-1.0, -1.0]] * 4, rewards=[rng.random() for _ in range(4)], finish_reasons=["stop"] * 4)
        for i in range(2)]
    published = []
    plain = step.train(engine, groups, cfg, tok.pad_token_id, publish=lambda: published.append(1))
    plain_keys = list(plain.record())
    plain.metrics_s = 0.0
    looped = list(plain.record(dict.fromkeys(LOOP_EXTRAS, 0)))
    with_stats = step.train(engine, groups, cfg, tok.pad_token_id, step=1, version=1, weight_stats=True)
    engine.close()
    with open(out_path, "w") as f:
        json.dump({"plain": plain_keys, "looped": looped, "with_stats": list(with_stats.record()),
                   "published": len(published), "line": json.loads(msgspec.json.encode(plain)),
                   "tensors": sorted(plain.tensors)}, f)


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("step") / "keys.json"
    p = mp.get_context("spawn").Process(target=_steps, args=(str(out),))
    p.start()
    p.join(300)
    assert p.exitcode == 0
    return json.loads(out.read_text())


def test_a_trained_step_records_the_keys_the_loop_wrote_to_metrics_jsonl_in_order(keys):
    assert keys["plain"] == METRICS_KEYS[:METRICS_KEYS.index("metrics_s")]
    assert keys["looped"] == METRICS_KEYS


def test_weight_statistics_come_after_the_timings_and_unset_fields_stay_out_of_the_line(keys):
    at = METRICS_KEYS.index("metrics_s")
    assert keys["with_stats"] == METRICS_KEYS[:at] + WEIGHT_KEYS
    assert "acc_t1" not in keys["line"] and "layer2_groups" not in keys["line"]  # multi-layer GRPO only


def test_the_step_publishes_once_inside_its_timings_and_carries_its_histogram_tensors_outside_the_record(keys):
    assert keys["published"] == 1
    assert keys["tensors"] == ["completion_mask", "learner_version", "policy_versions", "ratio", "rewards"]
    assert "tensors" not in keys["line"]
