"""Prometheus series of learner and actors (streamrl.telemetry.prometheus_metrics, actor_metrics), from real step
records."""

from __future__ import annotations

import math
import subprocess
import time

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest

from streamrl.algo import advantages, learning_signal, losses
from streamrl.comm.codec import ScoredGroup
from streamrl.comm.wire import FilteredCensus
from streamrl.learner import stepstats
from streamrl.learner.batch import collate
from streamrl.telemetry import actor_metrics, prometheus_metrics

R_MIN = 0.75


def group(rewards, version, tokens=(8, 9)):
    return ScoredGroup.from_samples(
        prompt_id="p", policy_version=version, actor_id="actor-0", prompt_tokens=[5, 6, 7],
        completions=[list(tokens)] * len(rewards), logprobs=[[-0.5] * len(tokens)] * len(rewards), rewards=rewards,
        finish_reasons=["stop"] * len(rewards))


def step(version: int, groups: list[ScoredGroup], step_no: int = 0, filtered=()) -> tuple[dict, dict]:
    """A step record and histogram inputs made by the learner's own code from real groups."""
    batch = collate(groups, pad_id=0)
    adv = advantages.compute(batch.rewards, "corpo", R_MIN, False)
    logp = batch.behaviour_logprobs + 0.01 * batch.completion_mask
    out = losses.compute("token_pg", logp, batch.behaviour_logprobs, adv.flatten(), batch.completion_mask)
    train = {"loss": float(out.loss), "grad_norm": 0.5, "lr": 1e-4, "optimizer_steps": 1, "fwd_bwd_s": 0.02,
             "optimizer_s": 0.01}
    timings = {"wait_s": 0.005, "batch_s": 0.001, "train_s": 0.03, "publish_s": 0.002}
    rec = stepstats.record(step_no, version, batch, adv, out, train, R_MIN, timings, filtered)
    return rec, stepstats.distributions(version, batch, out)


def learner(max_staleness: int = 2) -> tuple[CollectorRegistry, prometheus_metrics.LearnerMetrics]:
    registry = prometheus_metrics.new_registry()
    return registry, prometheus_metrics.LearnerMetrics(registry, "r1", "corpo", [0, 0.25, 0.5, 0.75, 1], max_staleness,
                                            {"on_policy": "async"})


def value(registry: CollectorRegistry, name: str, **labels) -> float | None:
    return registry.get_sample_value(name, {"run": "r1", "estimator": "corpo", **labels})


def test_every_learner_series_carries_run_and_estimator_labels():
    registry, m = learner()
    m.observe_step(*step(3, [group([1.0, 0.0], 3), group([0.5, 0.25], 2)]))
    names = [s for fam in registry.collect() if fam.name.startswith("streamrl_") for s in fam.samples]
    assert names and all(s.labels["run"] == "r1" and s.labels["estimator"] == "corpo" for s in names)


def test_gauges_keep_the_last_step_and_counters_sum_over_steps():
    registry, m = learner()
    rec1, d1 = step(3, [group([1.0, 0.0], 3), group([0.5, 0.25], 2)])
    rec2, d2 = step(4, [group([0.0, 0.0], 4), group([1.0, 1.0], 4)], step_no=1)
    m.observe_step(rec1, d1)
    m.observe_step(rec2, d2)
    assert value(registry, "streamrl_reward_mean") == pytest.approx(rec2["reward_mean"])
    assert value(registry, "streamrl_policy_version") == rec2["learner_version"]
    assert value(registry, "streamrl_learner_steps_total") == 2
    assert value(registry, "streamrl_trained_samples_total") == 8
    for sign, key in (("positive", "adv_pos"), ("negative", "adv_neg"), ("zero", "adv_zero")):
        assert value(registry, "streamrl_advantages_total", sign=sign) == rec1[key] + rec2[key]
    assert value(registry, "streamrl_learner_phase_seconds_total", phase="forward_backward") == pytest.approx(0.04)


def test_the_census_before_and_after_filtering_reaches_prometheus_by_cell():
    registry, m = learner()
    # Trained: 1 passed with A > 0 and 3 failed with A <= 0; an actor filtered 2 all-failed groups (4 samples).
    rec, d = step(3, [group([1.0, 0.0], 3), group([0.5, 0.25], 3)], filtered=[FilteredCensus(2, 0, 4, 0, 0), None])
    m.observe_step(rec, d)
    fraction = {stage: {cell: value(registry, "streamrl_sample_census_fraction", cell=cell, stage=stage)
                        for cell in learning_signal.CENSUS_KEYS} for stage in ("after_filter", "before_filter")}
    assert fraction["after_filter"] == {"failed_pos": 0, "failed_nonpos": 0.75, "passed_pos": 0.25, "passed_nonpos": 0}
    assert fraction["before_filter"] == {"failed_pos": 0, "failed_nonpos": 7 / 8, "passed_pos": 1 / 8,
                                         "passed_nonpos": 0}
    assert fraction["before_filter"] == {k[len("census_before_"):]: v for k, v in rec.items()
                                         if k.startswith("census_before_")}


def test_r_count_without_negative_advantages_is_exported_as_inf():
    registry, m = learner()
    rec, d = step(0, [group([1.0, 0.5], 0)])  # corpo baseline 0.75: one positive, one negative
    m.observe_step({**rec, "r_count": math.inf, "grad_norm": None}, d)
    assert value(registry, "streamrl_advantage_pos_neg_count_ratio") == math.inf
    assert math.isnan(value(registry, "streamrl_grad_norm"))


def test_histograms_count_every_sample_token_and_lag():
    registry, m = learner()
    rec, d = step(5, [group([1.0, 0.0], 5, tokens=(8, 9, 10)), group([0.5, 0.25], 3)])
    m.observe_step(rec, d)
    assert value(registry, "streamrl_sample_staleness_versions_bucket", le="0.0") == 2  # group at version 5
    assert value(registry, "streamrl_sample_staleness_versions_count") == 4
    assert value(registry, "streamrl_sample_staleness_versions_sum") == 2 * 2
    assert value(registry, "streamrl_token_staleness_versions_count") == 2 * 3 + 2 * 2
    assert value(registry, "streamrl_token_staleness_versions_sum") == 2 * 2 * 2  # 4 tokens at lag 2
    assert value(registry, "streamrl_reward_bucket", le="0.25") == 2
    assert value(registry, "streamrl_reward_sum") == pytest.approx(1.75)
    assert value(registry, "streamrl_importance_ratio_count") == rec["tokens"]


def test_without_a_scraper_pending_histogram_inputs_stay_bounded():
    registry, m = learner()
    rec, d = step(1, [group([1.0, 0.0], 1)])
    for _ in range(prometheus_metrics.FLUSH_EVERY):
        m.observe_step(rec, d)
    assert m._pending == []
    assert m.sample_staleness.counts.sum() == 2 * prometheus_metrics.FLUSH_EVERY


def test_intake_accounting_becomes_counters_with_drop_reasons_present_from_the_start():
    registry, m = learner()
    assert value(registry, "streamrl_groups_dropped_total", reason="stale") == 0
    m.observe_accounting({"groups_received": 10, "groups_used": 7, "groups_dropped": {"stale": 3},
                          "messages_rejected": {"bad_frame": 2}, "weight_requests_served": 1, "demands_sent": 0})
    assert value(registry, "streamrl_groups_received_total") == 10
    assert value(registry, "streamrl_groups_dropped_total", reason="stale") == 3
    assert value(registry, "streamrl_groups_dropped_total", reason="future") == 0
    assert value(registry, "streamrl_messages_rejected_total", reason="bad_frame") == 2


def test_the_stalled_clock_starts_at_startup_not_at_the_epoch():
    registry, _ = learner()
    assert time.time() - value(registry, "streamrl_last_step_timestamp_seconds") < 60


def test_actor_series_count_groups_samples_and_tokens():
    registry = prometheus_metrics.new_registry()
    a = actor_metrics.ActorMetrics(registry, "r1", "actor-3")
    a.observe_generate([group([1.0, 0.0], 0, tokens=(8, 9, 10)), group([0.5, 0.5], 0)], seconds=0.5)
    a.observe_sent(2, blocked_total_s=0.25)
    a.observe_sent(0, blocked_total_s=0.75)
    labels = {"run": "r1", "actor": "actor-3"}
    assert registry.get_sample_value("streamrl_actor_groups_generated_total", labels) == 2
    assert registry.get_sample_value("streamrl_actor_samples_generated_total", labels) == 4
    assert registry.get_sample_value("streamrl_actor_tokens_generated_total", labels) == 10
    assert registry.get_sample_value("streamrl_actor_generation_tokens_per_second", labels) == 20
    assert registry.get_sample_value("streamrl_actor_send_blocked_seconds_total", labels) == 0.75


def test_the_exposition_passes_promtool_check_metrics(promtool_bin):
    registry, m = learner()
    m.observe_step(*step(3, [group([1.0, 0.0], 3)]))
    actor = actor_metrics.ActorMetrics(registry, "r1", "actor-0")
    actor.observe_weights(3, 0.01)
    check = subprocess.run([promtool_bin, "check", "metrics"], input=generate_latest(registry), capture_output=True)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()


def test_histogram_inputs_come_from_tensors_on_any_device_unchanged():
    rewards = torch.tensor([[1.0, 0.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]])
    ratio = torch.tensor([[9.0, 1.5, 0.5], [9.0, 9.0, 2.0]])
    out = prometheus_metrics.histogram_arrays(4, rewards, torch.tensor([3]), mask, ratio)
    assert out["lag"].tolist() == [1, 1] and out["tokens"].tolist() == [2, 1]
    assert out["is_ratio"].tolist() == [1.5, 0.5, 2.0] and out["reward"].tolist() == [1.0, 0.0]
