"""The `reward` section: ordinal shaping of the task's reward."""

from __future__ import annotations

from streamrl.config.base import _Section
from streamrl.ordinal import check_shaping


class RewardConfig(_Section):
    bucket_edges: list[float] = []
    """Ordinal shaping: a task reward r goes to bucket #{edges <= r} ([]: keep the task's own scale)."""
    bucket_values: list[float] = []
    """Shaped reward of each bucket, ascending, len(bucket_edges)+1 ([]: evenly spaced over [0, 1])."""

    def __post_init__(self) -> None:
        check_shaping(self.bucket_edges, self.bucket_values)

