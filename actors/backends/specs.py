"""streamrl's own backends as plug-ins: what each can do and the `actors` keys only it takes, declared without
importing it (its engine, or torch): the entry points of group `streamrl.backends` name these, the config asks
them (`BACKENDS.can`) and parses a backend's keys by its Struct at load time, and the backend reads them typed
(`options(cfg.actors, EngineOptions)`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, TypeVar

from msgspec import Meta

from streamrl.registry import BACKENDS, Options, Plugin

if TYPE_CHECKING:
    from streamrl.config import ActorConfig

OptionsT = TypeVar("OptionsT", bound=Options)


class HFOptions(Options):
    """transformers in the actor's own process: the device it samples on."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """The device the hf backend samples on (auto: cuda when present; cpu: the actors take no GPU)."""


class EngineOptions(Options):
    """An inference engine (vLLM, SGLang): the GPUs it shards over, its share of each, how an update reaches it."""

    tensor_parallel_size: Annotated[int, Meta(gt=0)] = 1
    """GPUs one actor's engine shards the model over."""
    gpu_memory_fraction: Annotated[float, Meta(gt=0, le=1)] | None = None
    """GPU memory share an engine reserves (vLLM gpu_memory_utilization, SGLang mem_fraction_static; null: theirs)."""
    update_bucket_bytes: Annotated[int, Meta(gt=0)] = 512 * 1024 * 1024
    """A weight update reaches the engine in slices of at most this many bytes (one dtype each)."""


def options(actors: ActorConfig, cls: type[OptionsT]) -> OptionsT:
    """The backend options of the `actors` section as `cls`: the section's own where the backend it names takes
    them, else `cls`'s defaults (an hf sampler built beside a vLLM run's engine, as the eval comparisons do)."""
    return actors.options_as(BACKENDS, cls)


HF = Plugin(load="streamrl.actors.backends.hf:HFBackend", options=HFOptions,
            capabilities={"inflight_updates", "inflight_lora", "collective_sync", "ipc_sync", "full_logprobs",
                          "cpu_fork", "device_choice"})
"""transformers (CPU or one GPU): pauses between decoding steps, takes NCCL broadcasts and CUDA IPC handles, reports
full log-probs."""
VLLM = Plugin(load="streamrl.actors.backends.vllm:VLLMBackend", options=EngineOptions,
              capabilities={"inflight_updates", "tensor_parallel", "engine_memory", "collective_sync",
                            "collective_in_engine", "ipc_sync", "ipc_in_engine"})
"""vLLM: in-flight updates between engine steps; log-probs of the top-p truncated distribution; its workers take
collective and CUDA IPC versions themselves."""
SGLANG = Plugin(load="streamrl.actors.backends.sglang:SGLangBackend", options=EngineOptions,
                capabilities={"tensor_parallel", "engine_memory", "full_logprobs", "collective_sync",
                              "collective_in_engine", "collective_named_group", "ipc_sync", "ipc_in_engine"})
"""SGLang: weights between generate calls only; its workers take collective versions through SGLang's own entry points
(`named_group`'s convention), and CUDA IPC versions from its actor through `update_weights_from_tensor`."""
