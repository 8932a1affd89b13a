"""The `difficulty` section: online filtering of too easy and too hard prompts."""

from __future__ import annotations

from streamrl.config.base import PositiveInt, Fraction, _Section


class DifficultyConfig(_Section):
    online: bool = False
    """Actors skip prompts whose success rate over `rollouts` samples lies outside [low, high]."""
    rollouts: PositiveInt = 16
    """Samples seen per prompt before its success rate decides whether it is kept."""
    low: Fraction = 0.1
    """Prompts solved less often than this are too hard: excluded."""
    high: Fraction = 0.9
    """Prompts solved more often than this are too easy: excluded."""

    def __post_init__(self) -> None:
        if not self.low < self.high:
            raise ValueError(f"low={self.low}: must be below high ({self.high}); kept prompts have low <= rate <= high")

