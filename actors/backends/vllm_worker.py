"""Methods that vLLM's workers gain through `LLM(worker_extension_cls=WORKER_EXTENSION)`, reached from
the actor by `llm.collective_rpc(name, kwargs=...)`: each runs once in every worker, i.e. on every
tensor-parallel rank, which shards what it loads itself.

This follows vLLM's RLHF example (examples/offline_inference/rlhf_utils.py): weights load in place
through the model's own `load_weights`, which takes Hugging Face names and fuses/shards them
(q/k/v → qkv_proj, gate/up → gate_up_proj). Tensors come either as safetensors bytes in the call
itself or over an NCCL broadcast from the learner. The method names are not vLLM's: vLLM refuses an
extension that shadows a Worker method, and 0.32's Worker already has `update_weights`.

It runs where vLLM runs its model (a GPU build: CUDA tensors); the CPU build prepacks its linear
weights, so there the backend reloads from a folder instead (`reload_weights`, vLLM's own method).
"""

from __future__ import annotations

import math

import torch

WORKER_EXTENSION = "actors.backends.vllm_worker.WorkerExtension"


class WorkerExtension:
    """Mixed into vLLM's Worker (which provides self.device and self.model_runner)."""

    def load_weights_from_bytes(self, data: bytes) -> int:
        """Load a state dict serialised with safetensors (`safetensors.torch.save`): full, unsharded
        tensors named as in the Hugging Face checkpoint. Returns how many tensors loaded.

        Bytes, not tensors: collective_rpc's arguments cross to the engine process as msgpack, and a
        tensor inside untyped kwargs arrives there as a plain [dtype, shape, data] list."""
        from safetensors.torch import load

        weights = [(name, t.to(self.device)) for name, t in load(data).items()]
        self.model_runner.get_model().load_weights(weights=weights)
        return len(weights)

    def init_weight_update_group(self, master_address: str, master_port: int, rank_offset: int,
                                 world_size: int) -> None:
        """Join the learner's NCCL group: the learner is rank 0, this worker rank_offset + its own rank.

        A StatelessProcessGroup, as in vLLM's example: vLLM's workers already hold torch.distributed's
        default group (for tensor parallelism), so a second group cannot come from init_process_group.
        The learner side must create the same (vllm.distributed.utils.StatelessProcessGroup +
        PyNcclCommunicator) with rank 0.
        """
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.parallel_state import get_world_group
        from vllm.distributed.utils import StatelessProcessGroup

        rank = get_world_group().rank + rank_offset
        group = StatelessProcessGroup.create(host=master_address, port=master_port, rank=rank, world_size=world_size)
        self._streamrl_weight_group = PyNcclCommunicator(group, device=self.device)

    def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]]) -> int:
        """Receive one bucket broadcast from rank 0 as a single flat buffer (tensors in this order, one
        dtype per bucket as streamrl.weight_sync.plan makes them), then load it in place. dtypes are
        torch dtype names ("float32", "bfloat16"). Returns how many tensors loaded."""
        if len(set(dtypes)) != 1:
            raise ValueError(f"a weight bucket must hold one dtype, got {sorted(set(dtypes))}")
        numels = [math.prod(shape) for shape in shapes]
        flat = torch.empty(sum(numels), dtype=getattr(torch, dtypes[0]), device=self.device)
        self._streamrl_weight_group.broadcast(flat, src=0, stream=torch.cuda.current_stream())
        weights = [(name, part.view(shape)) for name, part, shape in zip(names, flat.split(numels), shapes)]
        self.model_runner.get_model().load_weights(weights=weights)
        return len(weights)
