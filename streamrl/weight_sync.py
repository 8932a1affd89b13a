"""Collective weight sync for GPU clusters: the learner's rank 0 broadcasts the weights to the
actors' workers in buckets (never tensor by tensor) over NCCL (gloo on CPU, for tests).

The bucket plan (names, dtypes, shapes, bucket boundaries) travels over ZeroMQ beforehand as a
`wire`-style msgspec message, so receivers can allocate; the collective itself carries a header
(version, bucket count), the buckets, and a tail of per-bucket checksums that receivers verify
before they let any tensor reach their engine. Every collective waits with a timeout, so a peer
that died turns into a `WeightSyncError` naming the version and bucket, never a silent hang.
With a generator of buckets (ZeRO-3 gathers them one by one), the next bucket is gathered while
the previous one is on the wire.
"""

from __future__ import annotations

import datetime
import time
from typing import Callable, Iterable, Iterator

import msgspec
import torch


class WeightSyncError(RuntimeError):
    """A sync failed: a collective timed out, or a bucket arrived corrupt (its checksum differs)."""


class TensorSpec(msgspec.Struct, array_like=True, frozen=True):
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class SyncPlan(msgspec.Struct, frozen=True):
    """How a state dict is cut into buckets: each bucket holds tensors of one dtype, in order."""

    buckets: list[list[TensorSpec]]

    @property
    def names(self) -> list[str]:
        return [t.name for b in self.buckets for t in b]


def plan(state: dict[str, torch.Tensor], bucket_bytes: int) -> SyncPlan:
    """Consecutive tensors of one dtype share a bucket up to bucket_bytes; a bigger tensor goes alone."""
    buckets: list[list[TensorSpec]] = []
    size, dtype = 0, None
    for name, t in state.items():
        spec = TensorSpec(name, str(t.dtype).removeprefix("torch."), tuple(t.shape))
        nbytes = t.numel() * t.element_size()
        if not buckets or spec.dtype != dtype or size + nbytes > bucket_bytes:
            buckets.append([])
            size, dtype = 0, spec.dtype
        buckets[-1].append(spec)
        size += nbytes
    return SyncPlan(buckets=buckets)


def flatten(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """One contiguous 1-D buffer of a bucket's tensors (a single collective moves it)."""
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def checksum(flat: torch.Tensor) -> float:
    """Order-sensitive float64 checksum of a bucket: a torn or misplaced bucket changes it."""
    x = flat.double()
    weights = torch.arange(1, x.numel() + 1, dtype=torch.float64, device=x.device).remainder_(1009).add_(1)
    return float((x * weights).sum())


class Group:
    """A process group of its own between learner rank 0 (rank 0 here) and the actors' workers,
    rendezvousing on a TCPStore at (host, port); separate from any group the learner trains in."""

    def __init__(self, host: str, port: int, rank: int, world: int, timeout_s: float, backend: str = "nccl"):
        import torch.distributed as dist

        self.rank, self.world, self.timeout_s = rank, world, timeout_s
        timeout = datetime.timedelta(seconds=timeout_s)
        try:
            self.store = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=timeout)
        except RuntimeError as e:  # the rendezvous itself timed out
            raise WeightSyncError(f"weight sync group {host}:{port}: rank {rank} of {world} could not meet the "
                                  f"others within {timeout_s:.0f}s ({e})") from None
        if backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(self.store, rank, world, opts)
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.pg = dist.ProcessGroupGloo(self.store, rank, world, timeout)
            self.device = torch.device("cpu")

    def broadcast(self, t: torch.Tensor, what: str) -> None:
        """Broadcast from rank 0 in place; raises WeightSyncError when it does not finish in time."""
        work = self.pg.broadcast(t, 0)
        try:
            done = work.wait(datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError as e:
            raise WeightSyncError(f"weight sync: {what} failed or timed out after {self.timeout_s:.0f}s "
                                  f"(rank {self.rank} of {self.world}): {e}") from None
        if done is False:
            raise WeightSyncError(f"weight sync: {what} did not finish in {self.timeout_s:.0f}s "
                                  f"(rank {self.rank} of {self.world})")


def send(group: Group, version: int, sync_plan: SyncPlan, buckets: Iterator[torch.Tensor]) -> dict:
    """Rank 0: broadcast `buckets` (flat tensors in plan order, made lazily: the next one is built
    while the previous is sent). Returns timings for metrics."""
    t0 = time.perf_counter()
    group.broadcast(torch.tensor([version, len(sync_plan.buckets)], dtype=torch.int64, device=group.device), "header")
    sums = []
    for i, flat in enumerate(buckets):
        flat = flat.to(group.device)
        sums.append(checksum(flat))
        group.broadcast(flat, f"version {version} bucket {i}")
    group.broadcast(torch.tensor(sums, dtype=torch.float64, device=group.device), f"version {version} checksums")
    return {"sync_s": time.perf_counter() - t0, "buckets": len(sums)}


def receive(group: Group, sync_plan: SyncPlan, load: Callable[[list[tuple[str, torch.Tensor]]], None],
            pause: Callable[[], object] | None = None) -> dict:
    """Worker: take one sync. Buckets are verified against rank 0's checksums before `load` sees any
    of them (all or nothing). `pause` (a context manager factory) brackets the load, and its time is
    reported as paused_s. Returns {version, buckets, sync_s, paused_s}."""
    t0 = time.perf_counter()
    header = torch.zeros(2, dtype=torch.int64, device=group.device)
    group.broadcast(header, "header")
    version, count = int(header[0]), int(header[1])
    if count != len(sync_plan.buckets):
        raise WeightSyncError(f"weight sync version {version}: {count} buckets sent, the plan has "
                              f"{len(sync_plan.buckets)} (learner and actor disagree on the model)")
    received = []
    for i, specs in enumerate(sync_plan.buckets):
        flat = torch.empty(sum(s.numel for s in specs), dtype=getattr(torch, specs[0].dtype), device=group.device)
        group.broadcast(flat, f"version {version} bucket {i}")
        received.append(flat)
    sums = torch.zeros(count, dtype=torch.float64, device=group.device)
    group.broadcast(sums, f"version {version} checksums")
    for i, flat in enumerate(received):
        # Same bytes give the same sum up to the reduction order of the receiving device.
        if abs(checksum(flat) - float(sums[i])) > 1e-9 * max(1.0, abs(float(sums[i]))):
            raise WeightSyncError(f"weight sync version {version}: bucket {i} checksum {checksum(flat)!r} != "
                                  f"{float(sums[i])!r}; the update is discarded")
    tensors = []
    for specs, flat in zip(sync_plan.buckets, received):
        for spec, part in zip(specs, flat.split([s.numel for s in specs])):
            tensors.append((spec.name, part.view(spec.shape)))
    t1 = time.perf_counter()
    if pause is None:
        load(tensors)
    else:
        with pause():
            load(tensors)
    t2 = time.perf_counter()
    return {"version": version, "buckets": count, "sync_s": t2 - t0, "paused_s": t2 - t1}
