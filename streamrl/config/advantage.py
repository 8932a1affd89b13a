"""The `advantage` section: the advantage estimator."""

from __future__ import annotations

from typing import Any

from streamrl.config.plugged import PluginSection
from streamrl.registry import ESTIMATORS


class AdvantageConfig(PluginSection):
    SELECTORS = (("estimator", ESTIMATORS),)
    SECTION = "advantage"

    estimator: str = "corpo"
    """Advantage estimator: corpo, grpo or static."""
    r_min_correct: float = 0.75
    """Smallest reward that counts as correct (the CoRPO/static threshold)."""
    std_normalize: bool = False
    """GRPO only: divide by the group's reward std."""
    opts: dict[str, Any] = {}
    """The options of an estimator that brings its own (a plug-in's), parsed by its Struct from the other keys."""

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator={self.estimator!r}: {ESTIMATORS.unknown(self.estimator)}")
        super().__post_init__()

