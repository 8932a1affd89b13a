"""Learning-signal statistics of a batch (docs/concepts/architecture.md, "Metric definitions").

Inputs are per sample: rewards R (N,), advantages A (N,), the loss contribution of each sample
(N,) and, per group, rewards (num_groups, G). All outputs are plain floats for metrics.jsonl.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

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
    return {f"census_{k}": v / n for k, v in census_cells(rewards, advantages, r_min_correct).items()}


def census_cells(rewards: torch.Tensor, advantages: torch.Tensor, r_min_correct: float) -> dict[str, int]:
    """Samples in each census cell (keys CENSUS_KEYS). rewards, advantages: same shape (any)."""
    failed, pos = rewards < r_min_correct, advantages > 0
    cells = (failed & pos, failed & ~pos, ~failed & pos, ~failed & ~pos)
    return {key: int(cell.sum()) for key, cell in zip(CENSUS_KEYS, cells)}


def census_before(rewards: torch.Tensor, advantages: torch.Tensor, r_min_correct: float,
                  filtered: dict[str, int]) -> dict[str, float]:
    """The census before dynamic filtering: shares over the trained samples (rewards, advantages: same
    shape) plus the samples of the groups filtered out, given as counts per cell (`filtered`, keys
    CENSUS_KEYS). With nothing filtered it equals `census`."""
    cells = census_cells(rewards, advantages, r_min_correct)
    both = {k: cells[k] + filtered.get(k, 0) for k in CENSUS_KEYS}
    n = max(1, sum(both.values()))
    return {f"census_before_{k}": v / n for k, v in both.items()}


CENSUS_KEYS = ("failed_pos", "failed_nonpos", "passed_pos", "passed_nonpos")


def census_counts(groups: list[list[float]], estimator: str, r_min_correct: float,
                  std_normalize: bool = False) -> dict[str, int]:
    """Samples of these groups in each census cell, with the advantages the learner would give them (advantages
    are per group, so an actor can count groups it never sends: the census before dynamic filtering).
    groups: rewards, each of G samples."""
    from streamrl.algo import advantages

    out = dict.fromkeys(CENSUS_KEYS, 0)
    if not groups:
        return out
    rewards = torch.tensor(groups, dtype=torch.float32)
    adv = advantages.compute(rewards, estimator, r_min_correct, std_normalize=std_normalize)
    return census_cells(rewards, adv, r_min_correct)


# Elements read at once: memory for the statistics stays at one chunk however large the model.
_CHUNK = 1 << 22


def weight_stats(params: Iterable[torch.Tensor] | Callable[[], Iterable[torch.Tensor]],
                 reduce: Callable[[torch.Tensor, str], torch.Tensor] | None = None,
                 chunk: int = _CHUNK) -> dict[str, float]:
    """L1 and L2 norms, min, max, mean and (lower) median over every element of `params`.

    params: tensors of any float dtype up to float32, or a function returning them afresh (read
    twice). Both passes go a chunk at a time, so no copy of all parameters is ever made. The median
    is a radix select on float32 bit patterns: the first pass counts elements by the high 16 bits
    of an order-preserving key, the second by the low 16 bits within the bucket holding the middle
    rank, which pins its value exactly. reduce(t, op) combines each pass's aggregates across
    processes that each hold a shard of the parameters (op: "sum", "min" or "max"); every process
    must then call weight_stats together.
    """
    source = params if callable(params) else (lambda: params)
    combine = reduce or (lambda t, op: t)

    def chunks():
        for p in source():
            flat = p.detach().reshape(-1)
            for a in range(0, flat.numel(), chunk):
                yield flat[a:a + chunk].float()

    device = next(iter(source()), torch.empty(0)).device
    f64 = {"dtype": torch.float64, "device": device}
    sums = torch.zeros(4, **f64)  # n, L1, L2², sum
    lo, hi = torch.tensor(math.inf, **f64), torch.tensor(-math.inf, **f64)
    high = torch.zeros(1 << 16, dtype=torch.int64, device=device)
    for x in chunks():
        if not x.numel():
            continue
        sums += torch.stack([torch.tensor(float(x.numel()), **f64), x.abs().sum(dtype=torch.float64),
                             x.double().square().sum(), x.sum(dtype=torch.float64)])
        lo, hi = torch.minimum(lo, x.min().double()), torch.maximum(hi, x.max().double())
        high += torch.bincount((_order_key(x) >> 16) + (1 << 15), minlength=1 << 16)
    sums, lo, hi, high = combine(sums, "sum"), combine(lo, "min"), combine(hi, "max"), combine(high, "sum")
    n = int(sums[0])
    if n == 0:
        raise ValueError("weight_stats: no parameters")
    k = (n - 1) // 2  # the lower median's rank, as torch.median
    bucket, k = _select(high, k)
    bucket -= 1 << 15  # the key's (signed) high 16 bits
    low = torch.zeros(1 << 16, dtype=torch.int64, device=device)
    for x in chunks():
        key = _order_key(x)
        low += torch.bincount(key[(key >> 16) == bucket] & 0xFFFF, minlength=1 << 16)
    offset, _ = _select(combine(low, "sum"), k)
    return {
        "weights_l1": float(sums[1]),
        "weights_l2": float(sums[2].sqrt()),
        "weights_min": float(lo),
        "weights_max": float(hi),
        "weights_mean": float(sums[3] / n),
        "weights_median": _from_order_key(bucket * (1 << 16) + offset),
    }


def _order_key(x: torch.Tensor) -> torch.Tensor:
    """float32 (n,) → int32 keys that sort as the floats do: a negative float's magnitude bits are
    flipped, so a larger magnitude makes a smaller key. Buckets: (key >> 16) + 2^15 in [0, 2^16)."""
    bits = x.view(torch.int32)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def _from_order_key(key: int) -> float:
    """The float32 whose _order_key is `key` (an int in [-2^31, 2^31))."""
    bits = key ^ 0x7FFFFFFF if key < 0 else key
    return float(torch.tensor([bits], dtype=torch.int32).view(torch.float32))


def _select(counts: torch.Tensor, k: int) -> tuple[int, int]:
    """The bucket holding the k-th smallest element (0-based) given per-bucket counts, and k's rank within it."""
    below = counts.cumsum(0)
    b = int(torch.searchsorted(below, torch.tensor(k, dtype=torch.int64, device=counts.device), right=True))
    return b, k - (int(below[b - 1]) if b else 0)
