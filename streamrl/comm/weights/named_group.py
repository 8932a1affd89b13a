"""The collective weight sync in an engine's own convention, for engines whose workers join the learner's group
through their documented entry points rather than streamrl's code (SGLang: `Engine.init_weights_update_group` and
`Engine.update_weights_from_distributed`).

SGLang 0.5.23 forms that group with `init_custom_process_group` (python/sglang/srt/utils/common.py): a TCP rendezvous
at `tcp://master_address:master_port` (rank 0, the learner here, holds the store), the store wrapped in
`PrefixStore(group_name, ...)`, then torch's `_new_process_group_helper`. The learner's rank must form it exactly so,
or the ranks never find one another's keys; `form` is that function's body with a timeout of ours.

Each version then goes as SGLang's workers receive it with `load_format="flattened_bucket"`
(srt/model_executor/model_runner_components/weight_updater.py: `FlattenedTensorBucket.empty(...)` and one
`broadcast` of its uint8 buffer): one broadcast per bucket of the bytes of the bucket's tensors end to end, with no
header and no checksum tail, since each `update_weights_from_distributed` call takes exactly one broadcast and loads
it at once. What streamrl's own ranks verify before loading (the bucket count, each bucket's checksum) an SGLang worker
cannot: the plan (names, dtypes, shapes) is still checked against the actor's model before any bucket is taken.
"""

from __future__ import annotations

import datetime

import torch

ENGINE_GROUP = "streamrl-weights"
"""The group name the learner and the engines' workers share (SGLang keys the group's store under it)."""


def form(host: str, port: int, rank: int, world: int, backend: str, group_name: str, timeout: datetime.timedelta,
         rendezvous_timeout: datetime.timedelta):
    """Rank `rank` of SGLang's named group (`init_custom_process_group`'s steps, with our timeouts): returns (store,
    process group). The rendezvous waits up to `rendezvous_timeout` for every rank; each collective up to
    `timeout`."""
    from torch.distributed import distributed_c10d as c10d

    store, rank, world = next(c10d.rendezvous(f"tcp://{host}:{port}", rank, world, timeout=rendezvous_timeout))
    store.set_timeout(timeout)
    store = c10d.PrefixStore(group_name, store)
    pg, _ = c10d._new_process_group_helper(world, rank, [], c10d.Backend(backend), store, group_name=group_name,
                                           backend_options=None, timeout=timeout, device_id=None)
    c10d._world.pg_group_ranks[pg] = {i: i for i in range(world)}
    return store, pg


def as_bytes(flat: torch.Tensor) -> torch.Tensor:
    """A bucket (n,) of one dtype as the (n · itemsize,) uint8 view SGLang's receiving workers allocate."""
    return flat.contiguous().view(torch.uint8)
