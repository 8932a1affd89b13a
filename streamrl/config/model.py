"""The `model` section: which policy model, its prompt formatting and length caps, the tiny model's shape."""

from __future__ import annotations

from typing import Literal

from streamrl.config.base import PositiveInt, _Section


class ModelConfig(_Section):
    path: str | None = None
    """Local Hugging Face model folder, or a hub id where downloads are allowed; null: the tiny random-init Llama below."""
    chat_template: Literal["auto", "on", "off"] = "auto"
    """Prompts as a user turn through the tokenizer's chat template: auto (when it has one), on (required), off (raw text)."""
    enable_thinking: bool | None = None
    """Chat template's thinking switch (Qwen3: false pre-fills an empty think block); null: the template's default."""
    max_seq_len: PositiveInt | None = None
    """Cap on prompt + completion tokens (a prompt leaving no room is skipped and counted); null: completion cap only."""
    max_prompt_tokens: PositiveInt | None = None
    """Cap on a prompt's tokens (a longer one is skipped and counted, as verl's filter_overlong_prompts); null: none."""
    hidden_size: PositiveInt = 64
    """Tiny model: hidden size."""
    num_layers: PositiveInt = 2
    """Tiny model: number of decoder layers."""
    num_heads: PositiveInt = 4
    """Tiny model: attention heads (hidden_size must divide by it)."""
    intermediate_size: PositiveInt = 128
    """Tiny model: MLP width."""
    context: PositiveInt = 256
    """Tiny model: context length in tokens, prompt + completion (its max_position_embeddings)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype on learner and actors."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads}: must divide hidden_size ({self.hidden_size})")

