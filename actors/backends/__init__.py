"""Generation backends. Each turns prompt token ids into G sampled completions per prompt with
the behaviour log-prob of every sampled token, and loads new weights in place.

`hf` (transformers, CPU or GPU) is the one backend today; a backend module is imported only
when chosen, so a GPU engine's heavy imports never slow down the others.
"""

from __future__ import annotations

from typing import Protocol

from streamrl.registry import Registry
from streamrl.sampling import Completion  # noqa: F401  (backends return these)


class Backend(Protocol):
    def generate(self, prompts: list[list[int]], n: int) -> list[list[Completion]]:
        """n completions for each prompt (outer list follows `prompts`)."""

    def load_weights(self, state: dict) -> None:
        """Replace the policy's weights with `state` ({name: tensor}) in place."""


BACKENDS: Registry = Registry("generation backend")


def build(name: str, cfg, model, tokenizer) -> Backend:
    if name == "hf":
        from actors.backends import hf  # noqa: F401  (registers itself)
    elif name == "sglang":
        from actors.backends import sglang  # noqa: F401
    return BACKENDS.get(name)(cfg, model, tokenizer)
