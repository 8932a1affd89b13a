"""What every generation backend is: the `Backend` protocol and the registry the backends add
themselves to. Backend modules import this, never the package, so the package's `__init__` can
import them to register them without an import cycle."""

from __future__ import annotations

from typing import Callable, Protocol

from streamrl.models.sampling import Completion
from streamrl.registry import Registry


class Backend(Protocol):
    def generate(self, prompts: list[list[int]], n: int,
                 between_steps: Callable[[], int] | None = None) -> list[list[Completion]]:
        """n completions for each prompt (outer list follows `prompts`). between_steps (in-flight
        updates; only backends that can pause between decoding steps take it, today hf): called
        between steps, may load new weights, returns the version now held; completions then carry
        their version span."""

    def load_weights(self, state: dict) -> None:
        """Replace the policy's weights with `state` ({name: tensor}) in place."""

    def eval_sampler(self, temperature: float, tokenizer):
        """A streamrl.evaluation.Sampler on this engine: sample(ids, n, max_new_tokens, seed), at `temperature`
        and top_p 1, each call seeded (evaluation's draws depend on the weights and the shard only)."""


BACKENDS: Registry = Registry("generation backend")

__all__ = ["BACKENDS", "Backend", "Completion"]
