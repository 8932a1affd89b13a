"""Ordinal reward shaping: condense a task's fine reward scale onto a coarser one.

The paper maps a 10-step scale onto 4 steps. A task reward r lands in bucket i = the number of
edges ≤ r, and the shaped reward is that bucket's value. `advantage.r_min_correct` is expressed
on the shaped scale, which is why a `Reward` knows its levels: config checks and metrics use them.
"""

from __future__ import annotations

import bisect
from typing import Sequence


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


class Reward:
    """task.score, then the configured bucketing. Counts unparseable completions (the task says which)."""

    def __init__(self, task, edges: Sequence[float] = (), values: Sequence[float] = ()):
        check_shaping(edges, values)
        self.task = task
        self.edges = list(edges)
        self.values = list(values) or (even_values(len(edges) + 1) if edges else [])

    @property
    def levels(self) -> list[float]:
        """Every reward this can return, ascending."""
        if not self.edges:
            return sorted(self.task.reward_levels)
        return sorted({bucket(r, self.edges, self.values) for r in self.task.reward_levels})

    @property
    def unparseable(self) -> int:
        return getattr(self.task, "unparseable", 0)

    def __call__(self, prompt, completion: str) -> float:
        r = self.task.score(prompt, completion)
        return bucket(r, self.edges, self.values) if self.edges else r


def build(cfg) -> Reward:
    """The shaped reward of a run `Config`."""
    from streamrl import tasks

    return Reward(tasks.build(cfg.task), cfg.reward.bucket_edges, cfg.reward.bucket_values)
