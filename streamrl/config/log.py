"""The `log` section: what the run directory keeps of what the model wrote."""

from __future__ import annotations

from streamrl.config.base import NonNegInt, PositiveInt, _Section


class LogConfig(_Section):
    samples_every: NonNegInt = 10
    """Every this many steps the learner writes samples of the batch to the run's samples.jsonl (0: never)."""
    samples_per_log: PositiveInt = 8
    """Most samples written each time: whole groups, first in the batch first (a group's advantages side by side)."""
