"""The `mgrpo` section: multi-layer GRPO's self-correction layer."""

from __future__ import annotations

import msgspec

from streamrl.config.base import PositiveInt, NonNegInt, _Section

DEFAULT_PHRASES = (
    "Wait, let me double-check that.",
    "Where might I have gone wrong this time? Let me double-check carefully.",
)


class MGRPOConfig(_Section):
    enabled: bool = False
    """Multi-layer GRPO: add a self-correction layer (layer 2) to every rollout."""
    phrases: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_PHRASES))
    """Guiding phrases appended to a layer-1 response to make a layer-2 query (one drawn at random)."""
    augment: NonNegInt | None = None
    """H: further samples of a kept correction's query; null: group_size - 1, so every group holds G samples."""
    min_correction_tokens: PositiveInt = 512
    """Room a correction is always left (at most actors.max_new_tokens): a longer layer-2 query is cut to fit."""
    max_query_tokens: PositiveInt | None = None
    """Cap on a layer-2 query's tokens (cut and counted); null: the model's context minus min_correction_tokens."""

    def __post_init__(self) -> None:
        if not self.phrases or not all(p.strip() for p in self.phrases):
            raise ValueError(f"phrases={self.phrases!r}: needs at least one non-empty phrase")

