"""Methods that vLLM's workers gain through `LLM(worker_extension_cls=WORKER_EXTENSION)`, reached from
the actor by `llm.collective_rpc(name, kwargs=...)`: each runs once in every worker, i.e. on every
tensor-parallel rank, which shards what it loads itself.

One update path on every platform: the actor writes the version into node-local shared memory
(actors/backends/shm_weights.py) and each worker streams it, bucket by bucket, into vLLM's own
in-place reload (`Worker.reload_weights(weights_iterator=...)`, vllm/model_executor/model_loader/
reload). That reload takes Hugging Face names through the model's `load_weights` (q/k/v → qkv_proj,
gate/up → gate_up_proj, sharded per rank), rebuilds one layer at a time and re-runs each layer's
post-load processing, which is what the CPU build's prepacked linear weights need and what
quantised GPU layers need. The tensors it gets are CPU views into the mapped files: the weight
loaders copy each into its parameter, so the GPU never holds a second copy of the model.

Why not the arguments of collective_rpc: they cross to the engine process as msgpack, which refuses
a bytes object over 4 GiB (and turns a tensor in untyped kwargs into a plain list). The method name
is not vLLM's: vLLM refuses an extension that shadows a Worker method.
"""

from __future__ import annotations

WORKER_EXTENSION = "streamrl.actors.backends.vllm_worker.WorkerExtension"


class WorkerExtension:
    """Mixed into vLLM's Worker (which provides reload_weights)."""

    def load_weights_from_shm(self, folder: str, buckets: list[list[list]]) -> int:
        """Load the version in `folder` (shm_weights.write's bucket files; buckets: per bucket, its
        [name, dtype, shape] entries in order) in place. Returns how many tensors were read."""
        import streamrl.actors.backends.shm_weights as shm_weights

        count = 0

        def weights():
            nonlocal count
            for item in shm_weights.read(folder, buckets):
                count += 1
                yield item

        self.reload_weights(weights_iterator=weights())
        return count
