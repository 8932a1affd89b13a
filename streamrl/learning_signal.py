"""Learning-signal statistics of a batch (DESIGN.md, "Learning-signal metrics").

Inputs are per sample: rewards R (N,), advantages A (N,), the loss contribution of each sample
(N,) and, per group, rewards (num_groups, G). All outputs are plain floats for metrics.jsonl.
"""

from __future__ import annotations

import math

import torch


def _ratio(num: float, den: float) -> float:
    """num / den, with inf for x/0 (x > 0) and nan for 0/0: both are what the signal really is."""
    if den == 0:
        return math.inf if num > 0 else math.nan
    return num / den


def learning_signal(
    group_rewards: torch.Tensor,
    advantages: torch.Tensor,
    sample_loss: torch.Tensor,
    r_min_correct: float,
) -> dict[str, float]:
    """r_count, r_loss, failed-positive fraction and CoRPO phase fraction.

    group_rewards, advantages: (num_groups, G). sample_loss: (num_groups, G), each sample's summed
    token loss. r_loss compares magnitudes of the loss contributed by A > 0 and A < 0 samples.
    """
    r = group_rewards.flatten()
    a = advantages.flatten()
    loss = sample_loss.flatten().abs()
    pos, neg = a > 0, a < 0
    failed = r < r_min_correct
    loss_pos, loss_neg = float(loss[pos].sum()), float(loss[neg].sum())
    return {
        "r_count": _ratio(float(pos.sum()), float(neg.sum())),
        "r_loss": _ratio(loss_pos, loss_neg),
        # r_loss over a window of steps is Σ loss_pos_sum / Σ loss_neg_sum, not a mean of per-step ratios.
        "loss_pos_sum": loss_pos,
        "loss_neg_sum": loss_neg,
        "adv_pos": int(pos.sum()),
        "adv_neg": int(neg.sum()),
        "adv_zero": int((a == 0).sum()),
        "failed_positive_fraction": float((failed & pos).float().mean()),
        # Share of groups whose CoRPO baseline sits at R_min_correct (group mean below threshold).
        "corpo_phase_fraction": float((group_rewards.mean(dim=1) < r_min_correct).float().mean()),
        **census(r, a, r_min_correct),
        "reward_mean": float(r.mean()),
        "success_rate": float((~failed).float().mean()),
    }


def census(rewards: torch.Tensor, advantages: torch.Tensor, r_min_correct: float) -> dict[str, float]:
    """The paper's Figure 1: share of samples in {failed, passed} × {A > 0, A ≤ 0}; the four sum to 1.

    rewards, advantages: same shape (any). GRPO puts mass in failed_pos; static and CoRPO never do.
    """
    n = max(1, rewards.numel())
    failed, pos = rewards < r_min_correct, advantages > 0
    return {
        "census_failed_pos": int((failed & pos).sum()) / n,
        "census_failed_nonpos": int((failed & ~pos).sum()) / n,
        "census_passed_pos": int((~failed & pos).sum()) / n,
        "census_passed_nonpos": int((~failed & ~pos).sum()) / n,
    }


CENSUS_KEYS = ("failed_pos", "failed_nonpos", "passed_pos", "passed_nonpos")


def census_counts(groups: list[list[float]], estimator: str, r_min_correct: float,
                  std_normalize: bool = False) -> dict[str, int]:
    """Samples of these groups in each census cell, with the advantages the learner would give them (advantages
    are per group, so an actor can count groups it never sends: the census before dynamic filtering).
    groups: rewards, each of G samples."""
    from streamrl import advantages

    out = dict.fromkeys(CENSUS_KEYS, 0)
    if not groups:
        return out
    rewards = torch.tensor(groups, dtype=torch.float32)
    adv = advantages.compute(rewards, estimator, r_min_correct, std_normalize=std_normalize)
    failed, pos = rewards < r_min_correct, adv > 0
    for key, cell in zip(CENSUS_KEYS, (failed & pos, failed & ~pos, ~failed & pos, ~failed & ~pos)):
        out[key] = int(cell.sum())
    return out


def weight_stats(params) -> dict[str, float]:
    """L1 and L2 norms, min, max, mean and median over every element of `params` (tensors of any shape).

    One float64 copy of all parameters is made (the median needs it): on a large model call this
    every few steps, as `learner.weight_stats_every` does.
    """
    flat = torch.cat([p.detach().reshape(-1).to("cpu", torch.float64) for p in params])
    return {
        "weights_l1": float(flat.abs().sum()),
        "weights_l2": float(flat.norm()),
        "weights_min": float(flat.min()),
        "weights_max": float(flat.max()),
        "weights_mean": float(flat.mean()),
        "weights_median": float(flat.median()),
    }
