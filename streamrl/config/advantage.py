"""The `advantage` section: the advantage estimator."""

from __future__ import annotations

from streamrl.config.base import _Section


class AdvantageConfig(_Section):
    estimator: str = "corpo"
    """Advantage estimator: corpo, grpo or static."""
    r_min_correct: float = 0.75
    """Smallest reward that counts as correct (the CoRPO/static threshold)."""
    std_normalize: bool = False
    """GRPO only: divide by the group's reward std."""

    def __post_init__(self) -> None:
        from streamrl.registry import ESTIMATORS

        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator={self.estimator!r}: {ESTIMATORS.unknown(self.estimator)}")

