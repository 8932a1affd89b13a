"""The `loss` section: the policy loss and its clipping, KL and entropy terms."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from streamrl.config.base import NonNegFloat, _Section


DEFAULT_LOSS = "token_pg"


class LossConfig(_Section):
    name: str = DEFAULT_LOSS
    """Policy loss from the loss registry (see `streamrl.algo.losses.LOSSES`)."""
    clip_low: Annotated[float, Meta(ge=0, lt=1)] = 0.2
    """PPO clip range below 1 for the importance ratio."""
    clip_high: NonNegFloat = 0.2
    """PPO clip range above 1 for the importance ratio."""
    is_cap: Annotated[float, Meta(ge=1)] = 2.0
    """Truncation cap on the importance ratio where PPO clipping does not bound it (A < 0)."""
    kl_coef: NonNegFloat = 0.0
    """Weight of the k3 KL penalty against the initial (reference) policy."""
    entropy_coef: NonNegFloat = 0.0
    """Weight of the entropy bonus."""
    aggregation: Literal["token", "sequence"] = "token"
    """How token losses add up: token (mean over the batch's tokens, DAPO) or sequence (mean per sequence, then over sequences: GRPO, MGRPO)."""

    def __post_init__(self) -> None:
        if self.name == DEFAULT_LOSS:  # registered (a test pins it): no torch import for the check
            return
        from streamrl.algo.losses import LOSSES

        if self.name not in LOSSES:
            raise ValueError(f"name={self.name!r}: {LOSSES.unknown(self.name)}")

