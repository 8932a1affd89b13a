"""Which sampled groups carry a learning signal: the paper's dynamic filtering and dynamic rollouts.

- Dynamic filtering drops a group whose rewards are all equal (zero variance: GRPO gives it no
  gradient at all, and under CoRPO it only says "everything here failed").
- Dynamic rollouts sample more for a group that lacks outcome diversity (no sample at or above
  R_min_correct, or none below), up to a multiple of G, then keep the G samples that maximise the
  reward variance.
"""

from __future__ import annotations

from typing import Sequence


def zero_variance(rewards: Sequence[float]) -> bool:
    return max(rewards) == min(rewards)


def diverse(rewards: Sequence[float], r_min_correct: float) -> bool:
    """At least one sample at or above the threshold and at least one below it."""
    return any(r >= r_min_correct for r in rewards) and any(r < r_min_correct for r in rewards)


def _variance(values: Sequence[float]) -> float:
    m = sum(values) / len(values)
    return sum((v - m) ** 2 for v in values) / len(values)


def max_variance_subset(rewards: Sequence[float], k: int) -> list[int]:
    """Indices of the k rewards with the largest population variance, in their original order.

    A variance-maximising k-subset always consists of some j smallest and k - j largest values
    (moving any inner value outwards cannot lower the spread), so trying the k + 1 splits of the
    sorted order is exact. Ties go to the earliest samples, which keeps the choice deterministic.
    """
    n = len(rewards)
    if not 0 < k <= n:
        raise ValueError(f"k={k}: must be in 1..{n} (the number of samples)")
    order = sorted(range(n), key=lambda i: (rewards[i], i))
    best, best_var = None, -1.0
    for j in range(k + 1):
        pick = order[:j] + order[n - (k - j):] if k - j else order[:j]
        var = _variance([rewards[i] for i in pick])
        if var > best_var + 1e-12:
            best, best_var = pick, var
    return sorted(best)
