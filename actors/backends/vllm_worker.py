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

With `transport.weight_sync=collective` the workers take the versions from the learner's NCCL group themselves
(gloo on the CPU build): `join_weight_sync` makes each worker a rank of the group, and `receive_weight_sync` takes
one broadcast version (verified bucket by bucket against the learner's checksums before any of it loads) into the
same in-place reload, so a version goes from the learner's GPU to the engine's without host memory or shared files.

With `transport.weight_sync=ipc` each worker opens the learner's CUDA IPC handle on its own device
(`load_weights_from_ipc`) and streams views of that buffer into the same in-place reload: the weight loaders copy from
the learner's GPU memory into the parameters, one device-to-device copy per tensor. vLLM has an IPC weight-transfer
engine of its own (`weight_transfer_config` backend "ipc", 0.32), but its handles are `rebuild_cuda_tensor`'s argument
tuples, torch classes included, which reach the workers only by pickle (VLLM_ALLOW_INSECURE_SERIALIZATION=1); the
handle here is plain ints and bytes (streamrl.comm.weights.ipc.CudaIpc), opened by the same `rebuild_cuda_tensor`.

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

    def join_weight_sync(self, host: str, port: int, first_rank: int, world: int, timeout_s: float,
                         rendezvous_s: float) -> int:
        """Join the learner's weight-sync group (streamrl.comm.weights.collective) as rank first_rank + this worker's
        rank; blocks until every member has joined. Returns the rank taken."""
        from streamrl.comm.weights.collective import Group, group_backend

        rank = first_rank + self.rank
        self.streamrl_weight_sync = Group(host, port, rank, world, timeout_s, group_backend(), rendezvous_s)
        return rank

    def receive_weight_sync(self, buckets: list[list[list]]) -> int:
        """Take the next version broadcast on the group (buckets: per bucket, its [name, dtype, shape] entries in
        order) and load it in place; every tensor-parallel rank takes the whole version and keeps its shard. Raises
        (nothing loaded) on a timeout or a bucket whose checksum differs. Returns how many tensors were loaded."""
        from streamrl.comm.weights.collective import SyncPlan, receive
        from streamrl.comm.wire import TensorInfo

        plan = SyncPlan(buckets=[[TensorInfo(name=n, dtype=d, shape=list(shape)) for n, d, shape in b]
                                 for b in buckets])
        got: list = []
        receive(self.streamrl_weight_sync, plan, got.extend)
        self.reload_weights(weights_iterator=iter(got))
        return len(got)

    def load_weights_from_ipc(self, handle: list, provider: str, entries: list[list], offsets: list[int],
                              total: int) -> int:
        """Open the learner's IPC `handle` (streamrl.comm.weights.ipc; `provider` names who opens it) on this worker's
        device and load the version in place from views of it (entries: each tensor's [name, dtype, shape] in the
        buffer's order; offsets: each tensor's byte offset). Returns how many tensors were loaded."""
        from streamrl.comm.weights import ipc
        from streamrl.comm.wire import TensorInfo

        tensors = [TensorInfo(name=n, dtype=d, shape=list(shape)) for n, d, shape in entries]
        flat = ipc.provider(provider).open(handle, self.device)
        named = ipc.views(flat, tensors, offsets, total)
        self.reload_weights(weights_iterator=iter(named))
        return len(named)
