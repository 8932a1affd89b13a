"""The ordinal reward scale: bucketing a task's fine levels onto the `reward` section's coarser ones.

A task's level r lands in bucket i = the number of edges ≤ r, and the shaped level is that bucket's value
(streamrl.tasks.rewards applies it per sample; the config checks `advantage.r_min_correct` against the levels).
"""

from __future__ import annotations

import bisect
from typing import Callable, Sequence


def bucket(r: float, edges: Sequence[float], values: Sequence[float]) -> float:
    """values[i] where i = #{edges ≤ r}: `edges` ascending, len(values) == len(edges) + 1."""
    return values[bisect.bisect_right(edges, r)]


def even_values(num_buckets: int) -> list[float]:
    """num_buckets values spread evenly over [0, 1]: 4 buckets → 0, 1/3, 2/3, 1."""
    return [i / (num_buckets - 1) for i in range(num_buckets)] if num_buckets > 1 else [1.0]


def check_shaping(edges: Sequence[float], values: Sequence[float]) -> None:
    """Raises ValueError naming the problem when edges/values cannot form an ordinal scale."""
    if any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"bucket_edges={list(edges)}: must be strictly increasing")
    if values and len(values) != len(edges) + 1:
        raise ValueError(f"bucket_values={list(values)}: needs len(bucket_edges) + 1 = {len(edges) + 1} values")
    if any(b <= a for a, b in zip(values, values[1:])):
        raise ValueError(f"bucket_values={list(values)}: must be strictly increasing (an ordinal scale)")


def _identity(x: float) -> float:
    return x


def shaped_levels(task_levels: Sequence[float], edges: Sequence[float], values: Sequence[float],
                  to_reward: Callable[[float], float] = _identity) -> list[float]:
    """Every reward a task with these levels can give after bucketing and its reward map, ascending."""
    values = list(values) or (even_values(len(edges) + 1) if edges else [])
    shaped = {bucket(r, edges, values) for r in task_levels} if edges else set(task_levels)
    return sorted({to_reward(r) for r in shaped})
