"""The `optim` section: optimizer and learning-rate schedule."""

from __future__ import annotations

from typing import Literal

from streamrl.config.base import NonNegInt, PositiveFloat, NonNegFloat, Fraction, _Section


class OptimConfig(_Section):
    lr: PositiveFloat = 3e-4
    """Peak learning rate (AdamW)."""
    weight_decay: NonNegFloat = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    warmup_steps: NonNegInt = 0
    """Linear warm-up steps from 0 to lr."""
    warmup_ratio: Fraction = 0.0
    """Warm-up as a share of `steps` (used instead of warmup_steps when > 0)."""
    schedule: Literal["constant", "cosine"] = "constant"
    """Learning rate after warm-up: constant, or cosine decay to 0 at the last step."""
    grad_clip: NonNegFloat = 1.0
    """Gradient-norm clip; 0 disables."""
    # Measured on the batch's stale groups (streamrl/algo/drift.py): a strict run has none and is never scaled. 3e-3
    # sits above the drift of tasks that learn steadily (1.2e-3-1.7e-3 per version) and below the 1.3e-2 at which
    # the chat dataset's policy ran away at lag 8-16 (docs/reference/benchmarks.md, "A step size bounded by drift").
    target_drift: PositiveFloat | None = 3e-3
    """KL(previous version ‖ next) per token each step is held to by scaling its lr (never above `lr`); null: off."""
