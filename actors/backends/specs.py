"""What each of streamrl's own backends can do, declared without importing it (its engine, or torch): the
entry points of group `streamrl.backends` name these, and the config asks them (`BACKENDS.can`) at load time."""

from __future__ import annotations

from streamrl.registry import Plugin

HF = Plugin(load="streamrl.actors.backends.hf:HFBackend",
            capabilities={"inflight_updates", "inflight_lora", "collective_sync", "full_logprobs", "cpu_fork",
                          "device_choice"})
"""transformers (CPU or one GPU): pauses between decoding steps, takes NCCL broadcasts, reports full log-probs."""
VLLM = Plugin(load="streamrl.actors.backends.vllm:VLLMBackend",
              capabilities={"inflight_updates", "tensor_parallel", "engine_memory"})
"""vLLM: in-flight updates between engine steps; log-probs of the top-p truncated distribution."""
SGLANG = Plugin(load="streamrl.actors.backends.sglang:SGLangBackend",
                capabilities={"tensor_parallel", "engine_memory", "full_logprobs"})
"""SGLang: weights between generate calls only."""
