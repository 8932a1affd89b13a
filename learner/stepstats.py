"""One metrics.jsonl record per learner step, and the strict on-policy self-check."""

from __future__ import annotations

import collections
from typing import Any, Mapping, Sequence

import torch

from streamrl.algo import drift, learning_signal, mgrpo, staleness
from streamrl.algo.losses import LossOutput
from streamrl.algo.variance import ess_fraction
from streamrl.comm.wire import FilteredCensus
from streamrl.learner.batch import Batch


class StrictModeViolation(RuntimeError):
    """on_policy=strict saw a step that was not on-policy; the run stops rather than lie."""


def record(step: int, learner_version: int, batch: Batch, adv: torch.Tensor, out: LossOutput, train: dict,
           r_min_correct: float, timings: dict, filtered: Sequence[FilteredCensus | None] = (),
           scored: Sequence[Sequence[bool]] = ()) -> dict:
    """Metrics of one step, the batch consumed at `learner_version` (the step makes learner_version + 1): the
    fields of learner.step.Step, which step.train makes of them (a key Step lacks fails there, loudly).
    filtered: what the batch's groups carry of the groups actors filtered out (ScoredGroup.filtered).
    scored: (num_groups, G) whether each sample's reward is a score (ScoredGroup.scored; empty: all are)."""
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
        **before_filtering(batch.rewards, adv, r_min_correct, filtered),
        **mgrpo_metrics(batch, r_min_correct),
        **scored_reward(batch.rewards, scored),
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
        **log_ratio_stats(out.ratio, batch.completion_mask, G),
        "clipped_fraction": float(out.clipped[m].float().mean()),
        **correction_stats(out.filled(batch.completion_mask), m),
        **train,
        **{k: round(v, 6) for k, v in timings.items()},
        "step_s": wall,
        "samples": num_groups * G,
        "tokens": int(m.sum()),
        "samples_per_s": num_groups * G / wall if wall else None,
        "tokens_per_s": int(m.sum()) / wall if wall else None,
    }


def scored_reward(rewards: torch.Tensor, scored: Sequence[Sequence[bool]]) -> dict:
    """reward_mean over the scored samples alone (None when none is), and how many were not. rewards:
    (num_groups, G); scored: the same shape as lists, or empty for all scored."""
    if not len(scored):
        return {"reward_mean": float(rewards.mean()), "samples_unscored": 0}
    mask = torch.tensor([list(s) for s in scored], dtype=torch.bool)
    return {"reward_mean": float(rewards[mask].mean()) if bool(mask.any()) else None,
            "samples_unscored": int((~mask).sum())}


def before_filtering(rewards: torch.Tensor, adv: torch.Tensor, r_min_correct: float,
                     filtered: Sequence[FilteredCensus | None]) -> dict:
    """`groups_filtered`: groups the actors' dynamic filter dropped on the way to this batch, and
    `census_before_*`: the census over the batch's samples plus theirs (`census_*` is after filtering:
    the trained samples alone). rewards, adv: (num_groups, G)."""
    carried = [f for f in filtered if f is not None]
    counts = dict.fromkeys(("groups", *learning_signal.CENSUS_KEYS), 0)
    for f in carried:
        for k in counts:
            counts[k] += getattr(f, k)
    return {"groups_filtered": counts.pop("groups"),
            **learning_signal.census_before(rewards, adv, r_min_correct, counts)}


def log_ratio_stats(ratio: torch.Tensor, completion_mask: torch.Tensor, group_size: int) -> dict:
    """KL(behaviour ‖ learner) estimated per group, its largest (the strict check's statistic) and
    the batch's, and |log ratio|: its mean over tokens and its largest per-sample mean.
    ratio, completion_mask: (B, L-1) with B = groups × group_size."""
    mask = completion_mask.to(torch.float64)
    r = ratio.double()
    dev = r.log().abs() * mask
    k3 = drift.k3(r) * mask
    per_sample = dev.sum(-1) / mask.sum(-1).clamp_min(1)  # (B,)
    per_group = k3.view(-1, group_size, k3.shape[-1]).sum((1, 2)) / \
        mask.view(-1, group_size, mask.shape[-1]).sum((1, 2)).clamp_min(1)  # (groups,)
    n = mask.sum().clamp_min(1)
    return {"kl_behaviour_learner": float(k3.sum() / n), "group_kl_behaviour_learner_max": float(per_group.max()),
            "log_ratio_abs_mean": float(dev.sum() / n), "sample_log_ratio_abs_max": float(per_sample.max())}


def correction_stats(out: LossOutput, m: torch.Tensor) -> dict:
    """The off-policy correction's footprint over the batch's model tokens m (B, L-1) bool: the shares of tokens
    whose importance weight was truncated or which a mask took out, and the effective sample size of the
    importance weights w as a fraction of the N tokens, (Σw)² / (N Σw²): 1 when every weight is equal, 1/N when one
    token carries them all, 0 when every token is masked."""
    return {"truncated_fraction": float(out.truncated[m].float().mean()),
            "masked_fraction": float(out.masked[m].float().mean()), "is_ess_fraction": ess_fraction(out.weights, m)}


def version_spans(batch: Batch) -> dict:
    spans = batch.last_versions - batch.policy_versions[:, None]  # (num_groups, G)
    return {"version_span_max": int(spans.max()), "inflight_fraction": float((spans > 0).float().mean())}


def mgrpo_metrics(batch: Batch, r_min_correct: float) -> dict:
    """Multi-layer GRPO's Acc@t1, Acc@t2 and deltas over the batch's layer-1 samples that carry a
    correction, and the layer-2 groups' count and mean reward; {} for a batch of neither."""
    has = ~torch.isnan(batch.corrections)
    layer2 = batch.layers == 2
    if not bool(has.any()) and not bool(layer2.any()):
        return {}
    t1 = (batch.rewards[has] >= r_min_correct).tolist()
    t2 = (batch.corrections[has] >= r_min_correct).tolist()
    # a batch whose layer-1 groups carry no corrections has no pairs: its accuracies are 0 of 0, left out
    return {**mgrpo.accuracy(t1, t2), "layer2_groups": int(layer2.sum()),
            "layer2_reward_mean": float(batch.rewards[layer2].mean()) if bool(layer2.any()) else None}


def distributions(learner_version: int, batch: Batch, out: LossOutput) -> dict:
    """What the learner's histograms need from a step, as references: prometheus_metrics.LearnerMetrics turns
    them into numpy and bins them later, in batches of steps, so the step pays almost nothing."""
    return {"learner_version": learner_version, "rewards": batch.rewards, "policy_versions": batch.policy_versions,
            "completion_mask": batch.completion_mask, "ratio": out.ratio.detach()}


# When learner.strict_ratio_tol is unset: 4 × the square of the parameter dtype's precision
# (torch.finfo eps), floored at 1e-7: bfloat16 2.4e-4, float16 3.8e-6, float32 1e-7 (float32 noise
# between engines' kernels, ~1e-6 per token, gives ~1e-12). A recomputed log-prob differs from the
# actor's by rounding, a fraction of eps that grows with the logits as the model sharpens; the KL
# estimate grows with the square of such differences, while a group sampled from other weights or at
# another temperature, off by a few hundredths on most tokens, lands above. Measured on the tiny
# model in bfloat16 (docs/concepts/how-it-works.md, "Strict on-policy"): on-policy groups 2e-7 at the start, up to 6.4e-5
# after 300 steps; one group one version back 1.3e-3, at temperature 0.8 instead of 1.0 5.1e-4.
_RATIO_TOL_FLOOR = 1e-7


def ratio_tolerance(configured: float | None, dtype: str) -> float:
    """The strict check's bound on any group's KL(behaviour ‖ learner) estimate for a model of `dtype`."""
    if configured is not None:
        return configured
    return max(_RATIO_TOL_FLOOR, 4 * torch.finfo(getattr(torch, dtype)).eps ** 2)


_STRICT_KEYS = ("step", "lag_max", "version_span_max", "optimizer_steps", "optimizer_skipped",
                "group_kl_behaviour_learner_max", "is_ratio_max_abs_dev")


def check_strict(step: Any, ratio_tol: float) -> None:
    """Raise StrictModeViolation unless the step was on-policy. step: a learner.step.Step, or a record's dict (a
    metrics.jsonl line). ratio_tol: see ratio_tolerance.

    The ratio test bounds each group's estimate of KL(behaviour ‖ learner), the mean over its tokens
    of r - 1 - log r (r the importance ratio), rather than the worst token's |r - 1|: half precision
    moves every log-prob by a fraction of its precision, which the worst of thousands of tokens shows
    in full, while the KL estimate weighs each token's deviation by its own size (quadratically), so
    rounding stays below eps² and a group sampled from other weights or at another temperature (the
    unit an actor makes with one set of weights) stands out by an order of magnitude or more.

    One optimizer step per batch is part of the proof: a second step (learner.minibatches > 1, which the config
    refuses in strict mode) would train on samples from weights the learner no longer has.
    """
    rec = step if isinstance(step, Mapping) else {k: getattr(step, k) for k in _STRICT_KEYS}
    if rec["lag_max"] != 0:
        raise StrictModeViolation(f"step {rec['step']}: consumed a group with lag {rec['lag_max']} (strict needs 0)")
    if rec["version_span_max"] != 0:
        raise StrictModeViolation(f"step {rec['step']}: a sample spans {rec['version_span_max'] + 1} policy versions "
                                  "(strict needs one)")
    # a step skipped for a zero gradient (learner.optimizer.step_unless_no_gradient) leaves the weights as they were
    if rec["optimizer_steps"] + rec.get("optimizer_skipped", 0) != 1:
        raise StrictModeViolation(
            f"step {rec['step']}: {rec['optimizer_steps']} optimizer steps on one batch (strict needs 1)")
    if rec["group_kl_behaviour_learner_max"] > ratio_tol:
        raise StrictModeViolation(
            f"step {rec['step']}: a group's KL(behaviour ‖ learner) estimated at "
            f"{rec['group_kl_behaviour_learner_max']:.2e} > "
            f"{ratio_tol:.1e} (learner.strict_ratio_tol; worst token |ratio - 1| {rec['is_ratio_max_abs_dev']:.2e}): "
            "actors did not sample from the learner's current weights at its temperature")
