"""The `lora` section: low-rank adapters on a frozen base."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from streamrl.config.base import NonNegInt, PositiveFloat, _Section


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraConfig(_Section):
    rank: NonNegInt = 0
    """LoRA rank r of every adapter; 0: off (full fine-tuning). With it on, only the adapters train and travel to actors."""
    alpha: PositiveFloat = 16.0
    """LoRA scaling numerator: an adapter adds (alpha / rank) * B @ A to its frozen base weight."""
    dropout: Annotated[float, Meta(ge=0, lt=1)] = 0.0
    """Dropout on an adapter's input while training (the learner's log-probs then differ from the actors' by it)."""
    target_modules: list[str] = msgspec.field(default_factory=lambda: list(LORA_TARGETS))
    """Module names (last component, as peft matches them) that get an adapter; the default is every decoder projection."""

    def __post_init__(self) -> None:
        if not self.target_modules:
            raise ValueError("target_modules=[]: name at least one module (e.g. q_proj, v_proj), or set rank=0")

