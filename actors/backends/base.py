"""What every generation backend is: the `Backend` protocol, `BackendDefaults` (the defaults of its optional
members, which streamrl's own backends inherit) and the registry the backends add themselves to. Backend
modules import this, never the package, so the package's `__init__` can import them to register them without
an import cycle."""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

from streamrl.models.sampling import Completion
from streamrl import registry
from streamrl.registry import Registry


@runtime_checkable
class Backend(Protocol):
    """Built as `Cls(cfg, model, tokenizer)` (cfg: the run's Config, seeded for this actor; its own `actors` keys:
    `specs.options(cfg.actors, ItsOptions)`). `end_ids`, `close` and `engine_stats` are optional: `BackendDefaults`
    gives what a backend without them means."""

    def generate(self, prompts: list[list[int]], n: int,
                 between_steps: Callable[[], int] | None = None) -> list[list[Completion]]:
        """n completions for each prompt (outer list follows `prompts`). between_steps (in-flight
        updates; only backends that can pause between decoding steps take it, today hf and vllm; the config
        refuses it for the others): called between steps, may load new weights, returns the version now held;
        completions then carry their version span."""

    def load_weights(self, state: dict) -> None:
        """Replace the policy's weights with `state` ({name: tensor}) in place."""

    def eval_sampler(self, temperature: float, tokenizer):
        """A streamrl.evaluation.Sampler on this engine: sample(ids, n, max_new_tokens, seed), at `temperature`
        and top_p 1, each call seeded (evaluation's draws depend on the weights and the shard only)."""

    @property
    def end_ids(self) -> list[int]:
        """Every token id that ends a completion (a multi-turn episode's turn ends at one); []: the tokenizer's eos."""

    def engine_stats(self) -> dict[str, Any] | None:
        """Figures for the actor's final report (engine start, update times, tokens/s); None: nothing to report."""

    def close(self) -> None:
        """Let the engine's processes and files go; the actor calls it last."""


class BackendDefaults:
    """The optional members of a `Backend`, with what a backend without them means."""

    end_ids: list[int] = []
    """None of its own: a turn ends at the tokenizer's eos token."""

    def engine_stats(self) -> dict[str, Any] | None:
        return None  # an in-process sampler has no engine of its own to report on

    def close(self) -> None:
        pass  # nothing outlives the actor's process


BACKENDS: Registry = registry.BACKENDS  # one registry for every kind of plug-in (streamrl.registry)

__all__ = ["BACKENDS", "Backend", "BackendDefaults", "Completion"]
