"""Collective weight sync for GPU clusters: the learner's rank 0 broadcasts the weights to the
actors' workers in buckets (never tensor by tensor) over NCCL (gloo on CPU, for tests).

The bucket plan (names, dtypes, shapes, bucket boundaries) travels over ZeroMQ beforehand as a
`wire`-style msgspec message, so receivers can allocate; the collective itself carries a header
(version, bucket count), the buckets, and a tail of per-bucket checksums that receivers verify
before they let any tensor reach their engine. Every collective waits with a timeout, so a peer
that died turns into a `WeightSyncError` naming the version and bucket, never a silent hang.
With a generator of buckets (ZeRO-3 gathers them one by one), the next bucket is gathered while
the previous one is on the wire.

In a run (`transport.weight_sync: collective`), `LearnerSync` and `ActorSync` are the two ends:
the group forms in the background while the processes start, and the learner's first publish
waits a while for it (below the actors' weights timeout); from then on each version is announced on the ZeroMQ weight
channel (`wire.WeightsCollective`, carrying the plan) and broadcast. Any failure (a dead actor, a
timeout, a torn bucket) sends that version over ZeroMQ instead and leaves the collective for
good: a run slows down, it never hangs.

Devices: NCCL takes CUDA tensors only and gloo CPU ones, so every tensor handed to a collective
is made on `Group.device`, which `collective_device` derives from the group's backend; the gloo
tests thereby run the code path NCCL runs. Error handling: under torchrun
`TORCH_NCCL_ASYNC_ERROR_HANDLING` is 1 (TearDown) and torch's own default is 3 (SkipCleanUp); in
both, NCCL's watchdog kills the process when a collective times out, which would turn a dead actor
into a dead learner instead of a fallback to ZeroMQ. ProcessGroupNCCL reads that variable once, in
its constructor (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp), so this group of its own is
built with it set to 2 (CleanUpOnly: abort this group's communicators and raise in `wait`, leave
the process alive) and the variable is put back at once: the learner's training group keeps its
own setting.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import math
import os
import threading
import time
from typing import Callable, Iterable, Iterator

import msgspec
import torch

from streamrl.comm.sync_messages import mismatch
from streamrl.comm.weights import named_group
from streamrl.comm.weights.checksums import checksum
from streamrl.comm.wire import TensorInfo, WeightsCollective

log = logging.getLogger(__name__)


class WeightSyncError(RuntimeError):
    """A sync failed: a collective timed out, or a bucket arrived corrupt (its checksum differs)."""


def _numel(t: TensorInfo) -> int:
    return math.prod(t.shape)


class SyncPlan(msgspec.Struct, frozen=True):
    """How a state dict is cut into buckets: each bucket holds tensors of one dtype, in order."""

    buckets: list[list[TensorInfo]]

    @property
    def names(self) -> list[str]:
        return [t.name for b in self.buckets for t in b]


def plan(state: dict[str, torch.Tensor], bucket_bytes: int) -> SyncPlan:
    """Consecutive tensors of one dtype share a bucket up to bucket_bytes; a bigger tensor goes alone."""
    buckets: list[list[TensorInfo]] = []
    size, dtype = 0, None
    for name, t in state.items():
        spec = TensorInfo.of(name, t.dtype, t.shape)
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


def collective_device(backend: str) -> torch.device:
    """The device whose tensors `backend`'s collectives take: CUDA (the current device) for nccl, CPU for gloo."""
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cuda")
    if backend == "gloo":
        return torch.device("cpu")
    raise ValueError(f"weight sync backend {backend!r}: expected 'nccl' or 'gloo'")


# ProcessGroupNCCL's ErrorHandlingMode: 2 = CleanUpOnly (abort the communicators, raise, keep the process).
NCCL_ERROR_HANDLING = "2"
_ENV_LOCK = threading.Lock()


@contextlib.contextmanager
def _nccl_error_handling(mode: str):
    """TORCH_NCCL_ASYNC_ERROR_HANDLING=mode while a ProcessGroupNCCL is constructed (it reads it there), then
    as it was."""
    with _ENV_LOCK:
        before = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = mode
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("TORCH_NCCL_ASYNC_ERROR_HANDLING", None)
            else:
                os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = before


class Group:
    """A process group of its own between learner rank 0 (rank 0 here) and the actors' workers,
    rendezvousing on a TCPStore at (host, port); separate from any group the learner trains in."""

    def __init__(self, host: str, port: int, rank: int, world: int, timeout_s: float, backend: str = "nccl",
                 rendezvous_s: float | None = None, group_name: str | None = None):
        """timeout_s bounds every collective; rendezvous_s (default timeout_s) the wait for the others to join;
        group_name: the group formed as an engine's workers form theirs (`named_group`: SGLang), else streamrl's."""
        import torch.distributed as dist

        self.rank, self.world, self.timeout_s = rank, world, timeout_s
        timeout = datetime.timedelta(seconds=timeout_s)
        meet_s = rendezvous_s or timeout_s
        self.backend = backend
        self.device = collective_device(backend)
        try:
            if group_name is not None:
                with _nccl_error_handling(NCCL_ERROR_HANDLING):
                    self.store, self.pg = named_group.form(host, port, rank, world, backend, group_name, timeout,
                                                           datetime.timedelta(seconds=meet_s))
                return
            self.store = dist.TCPStore(host, port, world, is_master=rank == 0,
                                       timeout=datetime.timedelta(seconds=meet_s))
        except RuntimeError as e:  # the rendezvous itself timed out
            raise WeightSyncError(f"weight sync group {host}:{port}: rank {rank} of {world} could not meet the "
                                  f"others within {meet_s:.0f}s ({e})") from None
        if backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            with _nccl_error_handling(NCCL_ERROR_HANDLING):
                self.pg = dist.ProcessGroupNCCL(self.store, rank, world, opts)
        else:
            # Connecting the pairs is part of meeting (slow starters); every collective after that gets timeout_s.
            self.pg = dist.ProcessGroupGloo(self.store, rank, world, datetime.timedelta(seconds=meet_s))
            self.pg.set_timeout(timeout)

    _connected = False
    """Whether a broadcast has finished on this group: NCCL sets up its communicators inside the first one."""

    def broadcast(self, t: torch.Tensor, what: str) -> None:
        """Broadcast from rank 0 in place; raises WeightSyncError when it fails or does not finish in time.

        Whatever the process group raises becomes a WeightSyncError, so the caller falls back to ZeroMQ: NCCL
        refuses a group with two ranks on one GPU ("Duplicate GPU detected") in `pg.broadcast` itself, not in
        `wait`. The first broadcast runs on a thread of its own, joined with the timeout: NCCL connects the
        ranks inside that call, before it returns anything to wait on, and a peer that never connects would
        block it with no timeout at all."""
        if t.device.type != self.device.type:  # NCCL would fail (or hang a peer) on a CPU tensor: say so here
            raise ValueError(f"weight sync: {what} is a {t.device.type} tensor; the {self.backend} group takes "
                             f"{self.device.type} tensors (make it on Group.device)")
        if not self._connected:
            self._first_broadcast(t, what)
            self._connected = True
            return
        self._broadcast(t, what)

    def _broadcast(self, t: torch.Tensor, what: str) -> None:
        t0 = time.monotonic()
        try:
            work = self.pg.broadcast(t, 0)
            done = work.wait(datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError as e:  # torch's DistBackendError and DistError derive from it
            # "after N s" is when it failed: NCCL refuses a duplicate GPU at once, a lost peer at the timeout
            raise WeightSyncError(f"weight sync: {what} failed after {time.monotonic() - t0:.1f}s (limit "
                                  f"{self.timeout_s:.0f}s; rank {self.rank} of {self.world}): {e}") from None
        if done is False:
            raise WeightSyncError(f"weight sync: {what} did not finish in {self.timeout_s:.0f}s "
                                  f"(rank {self.rank} of {self.world})")

    def _first_broadcast(self, t: torch.Tensor, what: str) -> None:
        failure: list[BaseException] = []

        def run() -> None:
            try:
                self._broadcast(t, what)
            except BaseException as e:  # noqa: BLE001  (handed to the caller's thread)
                failure.append(e)

        thread = threading.Thread(target=run, daemon=True, name="weight-sync-first-broadcast")
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():  # left blocked in the C++ call; the group is not used again
            raise WeightSyncError(f"weight sync: {what}, the group's first broadcast, did not finish in "
                                  f"{self.timeout_s:.0f}s (rank {self.rank} of {self.world}): a peer never connected")
        if failure:
            raise failure[0]


def send(group: Group, version: int, sync_plan: SyncPlan, buckets: Iterator[torch.Tensor], bare: bool = False) -> dict:
    """Rank 0: broadcast `buckets` (flat tensors in plan order, made lazily: the next one is built
    while the previous is sent); `bare`: each as bytes and nothing else (`named_group`: what SGLang's workers take).
    Returns timings for metrics."""
    t0 = time.perf_counter()
    if bare:
        for i, flat in enumerate(buckets):
            group.broadcast(named_group.as_bytes(flat.to(group.device)), f"version {version} bucket {i}")
        return {"sync_s": time.perf_counter() - t0, "buckets": len(sync_plan.buckets)}
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
        flat = torch.empty(sum(map(_numel, specs)), dtype=getattr(torch, specs[0].dtype), device=group.device)
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
        for spec, part in zip(specs, flat.split([_numel(s) for s in specs])):
            tensors.append((spec.name, part.view(spec.shape)))
    t1 = time.perf_counter()
    if pause is None:
        load(tensors)
    else:
        with pause():
            load(tensors)
    t2 = time.perf_counter()
    return {"version": version, "buckets": count, "sync_s": t2 - t0, "paused_s": t2 - t1}


def group_backend() -> str:
    """The group's backend in this process: NCCL where CUDA is, else gloo."""
    return "nccl" if torch.cuda.is_available() else "gloo"


class SyncRecord:
    """One end's record: versions that went over the collective, their time, and why it was left (for good)."""

    def __init__(self):
        self.failed: str | None = None
        self.syncs = 0
        self.sync_s = 0.0

    def fail(self, why: str) -> None:
        if self.failed is None:
            log.error("weight sync: %s; weights go over ZeroMQ from now on", why)
        self.failed = why

    def _count(self, sync: Callable[[], dict]) -> bool:
        """Run one sync and count it; on failure leave the collective (False)."""
        try:
            stats = sync()
        except WeightSyncError as e:
            self.fail(str(e))
            return False
        self.syncs += 1
        self.sync_s += stats["sync_s"]
        return True

    def report(self) -> dict:
        """For the run's summary: versions that went over the collective, their time, why it was left."""
        return {"syncs": self.syncs, "sync_s": round(self.sync_s, 3), "failed": self.failed}


class _Forming(SyncRecord):
    """A Group formed on a background thread (its rendezvous waits for every member)."""

    group_name: str | None = None
    """The engine convention the group is formed in (`named_group`: SGLang), None for streamrl's own."""

    def __init__(self, host: str, port: int, rank: int, world: int, timeout_s: float, rendezvous_s: float,
                 group_name: str | None = None):
        super().__init__()
        self.group: Group | None = None
        self.group_name = group_name
        self.timeout_s = timeout_s
        self.rendezvous_s = rendezvous_s
        self._thread = threading.Thread(target=self._form, args=(host, port, rank, world), daemon=True,
                                        name="weight-sync-rendezvous")
        self._thread.start()

    def _form(self, host: str, port: int, rank: int, world: int) -> None:
        try:
            self.group = Group(host, port, rank, world, self.timeout_s, group_backend(), self.rendezvous_s,
                               self.group_name)
            log.info("weight sync: rank %d of %d joined the %s group at %s:%d", rank, world, group_backend(), host,
                     port)
        except Exception as e:  # noqa: BLE001  (any failure means: stay on ZeroMQ)
            self.fail(f"could not form the group: {e}")

    @property
    def ready(self) -> bool:
        return self.group is not None and self.failed is None

    def close(self) -> None:
        """Wait for a rendezvous still under way to give up (it does within the timeout): a process
        that exits while that C++ call blocks its thread aborts instead of exiting cleanly."""
        if self._thread.is_alive():
            log.info("weight sync: waiting up to %.0fs for the group's rendezvous to end", self.rendezvous_s)
            self._thread.join(self.rendezvous_s + 5)


class LearnerSync(_Forming):
    """Learner rank 0's end: rank 0 of a group with one rank per receiver (an actor, or each worker of an engine that
    receives in its workers: `EngineSync`). group_name: the engine's own convention (`named_group`: SGLang)."""

    def __init__(self, host: str, port: int, receivers: int, timeout_s: float, rendezvous_s: float,
                 bucket_bytes: int, first_wait_s: float, group_name: str | None = None):
        super().__init__(host, port, 0, 1 + receivers, timeout_s, rendezvous_s, group_name)
        self.bucket_bytes = bucket_bytes
        self.plan: SyncPlan | None = None
        self.first_wait_s = first_wait_s
        self._waited = False

    def formed(self) -> bool:
        """Whether this version goes over the collective. The first call waits up to first_wait_s for
        the group to form, so that with every actor up every version goes collective; the learner
        serves no weights meanwhile, so the wait must stay below the actors' weights timeout. Later
        calls never wait: until the group forms, ZeroMQ carries the versions."""
        if not self._waited:
            self._thread.join(self.first_wait_s)
            self._waited = True
        return self.ready

    def announcement(self, version: int, state: dict[str, torch.Tensor], learner: str) -> WeightsCollective:
        self.plan = self.plan or plan(state, self.bucket_bytes)
        return WeightsCollective(version=version, buckets=self.plan.buckets, sent_at=time.time(), learner=learner)

    def send(self, version: int, state: dict[str, torch.Tensor]) -> bool:
        """Broadcast `state` (after its announcement); False (and the collective left) on failure."""
        assert self.group is not None and self.plan is not None
        buckets = (flatten(state[s.name] for s in b) for b in self.plan.buckets)
        return self._count(lambda: send(self.group, version, self.plan, buckets, bare=self.group_name is not None))


class ActorSync(_Forming):
    """An actor's end: rank 1 + index. `receive` is what the weight subscriber calls when an
    announcement arrives; it returns {name: tensor} or None (then the actor asks over ZeroMQ)."""

    def __init__(self, host: str, port: int, index: int, actors: int, timeout_s: float, rendezvous_s: float,
                 expected: dict[str, torch.Tensor]):
        super().__init__(host, port, 1 + index, 1 + actors, timeout_s, rendezvous_s)
        self.expected = {name: TensorInfo.of(name, t.dtype, t.shape) for name, t in expected.items()}

    def receive(self, msg: WeightsCollective) -> dict[str, torch.Tensor] | None:
        # The learner announces only once its group has formed, so ours is about to: wait for it.
        self._thread.join(self.rendezvous_s)
        if not self.ready:
            return None
        sync_plan = SyncPlan(buckets=msg.buckets)
        if why := mismatch(msg, self.expected):
            self.fail(why)
            return None
        got: dict[str, torch.Tensor] = {}
        return got if self._count(lambda: receive(self.group, sync_plan, got.update)) else None

