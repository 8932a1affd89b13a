"""One metrics.jsonl record per learner step, and the strict on-policy self-check."""

from __future__ import annotations

import collections

import torch

from learner.batch import Batch
from streamrl import learning_signal, mgrpo, staleness
from streamrl.losses import LossOutput


class StrictModeViolation(RuntimeError):
    """on_policy=strict saw a step that was not on-policy; the run stops rather than lie."""


def record(step: int, learner_version: int, batch: Batch, adv: torch.Tensor, out: LossOutput, train: dict,
           r_min_correct: float, timings: dict) -> dict:
    """Metrics of one step, the batch consumed at `learner_version` (the step makes learner_version + 1)."""
    num_groups, G = batch.rewards.shape
    sample_loss = out.token_loss.sum(-1).view(num_groups, G)
    m = batch.completion_mask.bool()
    ratio = out.ratio[m]
    lags = staleness.lag(learner_version, batch.policy_versions).tolist()
    hist = collections.Counter(lags)
    wall = sum(timings.values())
    return {
        "step": step,
        "learner_version": learner_version + 1,
        **learning_signal.learning_signal(batch.rewards, adv, sample_loss, r_min_correct),
        **mgrpo_metrics(batch, r_min_correct),
        "reward_std": float(batch.rewards.std()),
        "advantage_mean": float(adv.mean()),
        "lag_max": max(lags),
        "lag_mean": sum(lags) / len(lags),
        "lag_hist": {str(k): v for k, v in sorted(hist.items())},
        # In-flight updates: how many samples mixed versions, and the widest span (0 without them).
        **version_spans(batch),
        "is_ratio_mean": float(ratio.mean()),
        "is_ratio_min": float(ratio.min()),
        "is_ratio_max": float(ratio.max()),
        "is_ratio_max_abs_dev": float((ratio - 1).abs().max()),
        "clipped_fraction": float(out.clipped[m].float().mean()),
        **train,
        **{k: round(v, 6) for k, v in timings.items()},
        "step_s": wall,
        "samples": num_groups * G,
        "tokens": int(m.sum()),
        "samples_per_s": num_groups * G / wall if wall else None,
        "tokens_per_s": int(m.sum()) / wall if wall else None,
    }


def version_spans(batch: Batch) -> dict:
    spans = batch.last_versions - batch.policy_versions[:, None]  # (num_groups, G)
    return {"version_span_max": int(spans.max()), "inflight_fraction": float((spans > 0).float().mean())}


def mgrpo_metrics(batch: Batch, r_min_correct: float) -> dict:
    """Multi-layer GRPO's Acc@t1, Acc@t2 and deltas over the batch's layer-1 samples that carry a
    correction, and the layer-2 groups' count and mean reward; {} for a batch without corrections."""
    has = ~torch.isnan(batch.corrections)
    if not bool(has.any()):
        return {}
    t1 = (batch.rewards[has] >= r_min_correct).tolist()
    t2 = (batch.corrections[has] >= r_min_correct).tolist()
    layer2 = batch.layers == 2
    return {**mgrpo.accuracy(t1, t2), "layer2_groups": int(layer2.sum()),
            "layer2_reward_mean": float(batch.rewards[layer2].mean()) if bool(layer2.any()) else None}


def distributions(learner_version: int, batch: Batch, out: LossOutput) -> dict:
    """What the learner's histograms need from a step, as references: prometheus_metrics.LearnerMetrics turns
    them into numpy and bins them later, in batches of steps, so the step pays almost nothing."""
    return {"learner_version": learner_version, "rewards": batch.rewards, "policy_versions": batch.policy_versions,
            "completion_mask": batch.completion_mask, "ratio": out.ratio.detach()}


def check_strict(rec: dict, ratio_tol: float) -> None:
    if rec["lag_max"] != 0:
        raise StrictModeViolation(f"step {rec['step']}: consumed a group with lag {rec['lag_max']} (strict needs 0)")
    if rec["version_span_max"] != 0:
        raise StrictModeViolation(f"step {rec['step']}: a sample spans {rec['version_span_max'] + 1} policy versions "
                                  "(strict needs one)")
    if rec["optimizer_steps"] != 1:
        raise StrictModeViolation(
            f"step {rec['step']}: {rec['optimizer_steps']} optimizer steps on one batch (strict needs 1)")
    if rec["is_ratio_max_abs_dev"] > ratio_tol:
        raise StrictModeViolation(
            f"step {rec['step']}: importance ratio off by {rec['is_ratio_max_abs_dev']:.2e} > {ratio_tol:.0e}: "
            "actors did not sample from the learner's current weights")
