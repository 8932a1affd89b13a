"""CUDA IPC weight sync on one node (transport.weight_sync=ipc): actors map the learner's GPU memory instead of
taking the weights through host memory and ZeroMQ.

Per version the learner copies its weights into one flat byte buffer on its GPU (the chunks' `Layout`: every tensor
64-byte aligned), exports it as one handle per actor, and announces it on the ZeroMQ weight channel
(`wire.WeightsIpc`: the manifest of names, dtypes, shapes and offsets, the handles, and the manifest's own
checksum). An actor verifies the manifest against its model, opens its handle on its device, copies the tensors out
and acknowledges the version on the control channel (`wire.WeightsIpcAck`); the learner frees a buffer once every
actor still on IPC acknowledged it or a newer version, and never holds more than KEEP_VERSIONS of them.

Handles come from a provider: `CudaIpc` is torch's own CUDA IPC (torch.multiprocessing.reductions: `reduce_tensor`
makes the handle, `rebuild_cuda_tensor` opens it). Each `reduce_tensor` call registers a fresh reference counter
with the exporting process, which keeps the memory alive until the opener lets go, hence one handle per actor. Tests
pass a provider of their own (tests/fakes/ipc.py) to run this protocol on CPU. A provider is found by the name the
manifest carries (`PROVIDERS`), which is how an engine's worker process, that holds no receiver, opens a handle.

Engines (vLLM, SGLang) take the version themselves (`IpcReceiver(into=...)`, the backend's `receive_weight_ipc`):
vLLM's workers open the handle on their own devices and stream `views` of it into their in-place reload; SGLang's
actor opens it and hands the engine one bucket at a time (its `update_weights_from_tensor` carries CUDA tensors to
its workers by CUDA IPC itself). The acknowledgement follows the load, so the learner frees nothing still read.

Fallback: the learner without CUDA (or whose weights are not on a GPU) announces nothing and sends over ZeroMQ, with
one log line; an actor whose handle cannot be opened (another node, no CUDA, a peer-access failure) logs one line
naming the reason, tells the learner (ok=False: it gets no handle from then on) and asks for the version over
ZeroMQ, as after a failed collective. A damaged manifest is refused (`ipc_manifest`, counted) and the version asked
for over ZeroMQ; the actor stays on IPC.
"""

from __future__ import annotations

import logging
import math
import time
import zlib
from typing import Callable, Protocol

import msgspec
import torch

from streamrl.comm import wire
from streamrl.comm.weights.chunks import Layout
from streamrl.comm.weights.engine_sync import InEngine

log = logging.getLogger(__name__)

KEEP_VERSIONS = 2
"""Exported buffers the learner holds at most (each the size of the published weights, in its GPU memory): an
actor that has not acknowledged an older one by then is too slow or gone, and the oldest is freed."""


class Provider(Protocol):
    """Makes and opens handles of a flat (n,) uint8 buffer; `name` travels in the manifest."""

    name: str

    def export(self, flat: torch.Tensor) -> list:
        """A msgpack-able handle (ints, bytes, bools) another process on this node opens with `open`."""

    def open(self, handle: list, device: torch.device) -> torch.Tensor:
        """The (n,) uint8 buffer `handle` names; raises when it cannot be opened here."""

    def release(self, flat: torch.Tensor) -> None:
        """The exporter let go of `flat` (its version is acknowledged or too old)."""


class CudaIpc:
    """torch's CUDA IPC (torch/multiprocessing/reductions.py): `reduce_tensor` gives
    (rebuild_cuda_tensor, (tensor_cls, size, stride, offset, storage_cls, dtype, device, handle, storage_size_bytes,
    storage_offset_bytes, requires_grad, ref_counter_handle, ref_counter_offset, event_handle,
    event_sync_required)); the types stay out of the wire (always Tensor, TypedStorage, uint8)."""

    name = "cuda"

    def export(self, flat: torch.Tensor) -> list:
        from torch.multiprocessing.reductions import reduce_tensor

        if flat.device.type != "cuda":
            raise ValueError(f"CUDA IPC exports CUDA tensors; this buffer is on {flat.device}")
        _, args = reduce_tensor(flat)
        (_, size, _, offset, _, _, device, handle, size_bytes, offset_bytes, _, counter, counter_offset, event,
         event_sync) = args
        return [int(size[0]), int(offset), int(device), handle, int(size_bytes), int(offset_bytes), counter,
                int(counter_offset), event, bool(event_sync)]

    def open(self, handle: list, device: torch.device) -> torch.Tensor:
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device in this process")
        numel, offset, src, ipc, size_bytes, offset_bytes, counter, counter_offset, event, event_sync = handle
        flat = rebuild_cuda_tensor(torch.Tensor, (numel,), (1,), offset, torch.storage.TypedStorage, torch.uint8, src,
                                   ipc, size_bytes, offset_bytes, False, counter, counter_offset, event, event_sync)
        return flat if flat.device == device else flat.to(device)  # another GPU of the node: through peer access

    def release(self, flat: torch.Tensor) -> None:
        torch.cuda.ipc_collect()  # frees the buffers every opener has let go of


PROVIDERS: dict[str, Provider] = {CudaIpc.name: CudaIpc()}
"""Providers by the name a manifest carries: where a process that holds no receiver (an engine's worker) finds the
one that opens a handle. Tests add theirs."""


def provider(name: str) -> Provider:
    if name not in PROVIDERS:
        raise LookupError(f"no IPC handle provider named {name!r} in this process (known: {', '.join(PROVIDERS)})")
    return PROVIDERS[name]


def views(flat: torch.Tensor, tensors: list[wire.TensorInfo], offsets: list[int], total: int
          ) -> list[tuple[str, torch.Tensor]]:
    """The named tensors of an opened (n,) uint8 buffer, as views into it (no copy), in the manifest's order; raises
    when the buffer is shorter than the manifest says."""
    if flat.numel() < total:
        raise ValueError(f"the buffer opened has {flat.numel()} bytes, the manifest says {total}")
    return [(t.name, flat[o:o + _numel(t) * _size(t)].view(getattr(torch, t.dtype)).view(t.shape))
            for t, o in zip(tensors, offsets)]


def manifest_checksum(msg: wire.WeightsIpc) -> int:
    """CRC-32 of the manifest's msgpack bytes with checksum 0: any field changed on the way changes it."""
    return zlib.crc32(msgspec.msgpack.encode(msgspec.structs.replace(msg, checksum=0)))


def verify(msg: wire.WeightsIpc, expected: dict[str, wire.TensorInfo], provider: str) -> None:
    """Raises WireError("ipc_manifest") unless `msg` is intact and describes this actor's model in a sane layout."""
    def refuse(why: str) -> None:
        raise wire.WireError("ipc_manifest", f"weights version {msg.version} over IPC: {why}; the version is refused")

    if manifest_checksum(msg) != msg.checksum:
        refuse(f"manifest checksum {msg.checksum} does not match its contents ({manifest_checksum(msg)})")
    if msg.provider != provider:
        refuse(f"handles of provider {msg.provider!r}, this actor opens {provider!r}")
    if {t.name: t for t in msg.tensors} != expected or len(msg.tensors) != len(expected):
        refuse(f"the learner's tensors differ from this actor's model "
               f"({sorted(set(t.name for t in msg.tensors) ^ set(expected))[:3] or 'dtypes or shapes'})")
    if len(msg.offsets) != len(msg.tensors):
        refuse(f"{len(msg.offsets)} offsets for {len(msg.tensors)} tensors")
    end = 0
    for t, offset in zip(msg.tensors, msg.offsets):
        size = _size(t)
        if offset < end or offset % size:
            refuse(f"tensor {t.name} at byte {offset} overlaps the one before or is misaligned")
        end = offset + size * _numel(t)
    if end > msg.total:
        refuse(f"the tensors end at byte {end}, past the buffer's {msg.total}")


def _numel(t: wire.TensorInfo) -> int:
    return math.prod(t.shape)


class IpcExporter:
    """The learner's end: exports each version for `actors` actors ("actor-0".. "actor-{n-1}") and frees the
    buffers as they acknowledge. Same face as collective.LearnerSync: `formed`, `announcement`, `send`, `report`."""

    def __init__(self, provider: Provider, actors: int, keep: int = KEEP_VERSIONS):
        self.provider, self.keep = provider, keep
        self.actors = [f"actor-{i}" for i in range(actors)]
        self.live: dict[int, torch.Tensor] = {}
        """version -> its exported buffer, until acknowledged (or too old)."""
        self.acked: dict[str, int] = {}
        """actor_id -> the newest version it acknowledged."""
        self.left: dict[str, str] = {}
        """Actors that could not open a handle (they take ZeroMQ), and why."""
        self.failed: str | None = None
        self.exports = self.released = self.released_unacked = self.refused_acks = 0
        self.newest = -1
        """The newest version exported: an acknowledgement claims no more than it."""
        self.export_s = 0.0

    def fail(self, why: str) -> None:
        if self.failed is None:
            log.error("weight sync ipc: %s; weights go over ZeroMQ from now on", why)
        self.failed = why

    def formed(self) -> bool:
        """Whether this version goes over IPC: CUDA here and an actor still on IPC."""
        if self.failed is None and self.provider.name == "cuda" and not torch.cuda.is_available():
            self.fail("no CUDA on the learner")
        if self.failed is None and self.actors and len(self.left) == len(self.actors):
            self.failed = "every actor left IPC"  # each one's reason was logged as it left
        return self.failed is None

    def announcement(self, version: int, state: dict[str, torch.Tensor], learner: str) -> wire.WeightsIpc | None:
        """`state` copied into a fresh buffer and exported; None (and IPC left) if that fails."""
        t0 = time.perf_counter()
        layout = Layout(state)
        try:
            first = next(iter(state.values()), None)
            flat = torch.empty(layout.total, dtype=torch.uint8, device=first.device if first is not None else "cpu")
            for t, offset, n in zip(state.values(), layout.offsets, layout.sizes):
                flat[offset:offset + n].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
            handles = [[] if a in self.left else self.provider.export(flat) for a in self.actors]
        except Exception as e:  # noqa: BLE001  (any failure means: this and later versions over ZeroMQ)
            self.fail(f"version {version} could not be exported ({type(e).__name__}: {e})")
            return None
        self.live[version] = flat
        self.exports += 1
        self.newest = version
        self._release()
        msg = wire.WeightsIpc(version=version, tensors=layout.infos, offsets=layout.offsets, total=layout.total,
                              provider=self.provider.name, handles=handles, sent_at=time.time(), learner=learner)
        msg.checksum = manifest_checksum(msg)
        self.export_s += time.perf_counter() - t0
        return msg

    def send(self, version: int, state: dict) -> bool:
        """Nothing to send: the actors open the handles."""
        return True

    def ack(self, msg: wire.WeightsIpcAck) -> None:
        """An actor's acknowledgement (from the control channel): frees what no actor on IPC still needs."""
        if msg.actor_id not in self.actors or msg.version > self.newest:
            self.refused_acks += 1  # an actor this run does not have, or a version never exported: freed nothing
            log.warning("weight sync ipc: refused an acknowledgement of version %d from %r (actors %s, newest "
                        "version %d)", msg.version, msg.actor_id[:64], ", ".join(self.actors[:4]), self.newest)
            return
        if not msg.ok:
            if msg.actor_id not in self.left:
                log.warning("weight sync ipc: %s takes ZeroMQ from now on: %s", msg.actor_id, msg.reason)
            self.left[msg.actor_id] = msg.reason[:500]
        else:
            self.acked[msg.actor_id] = max(self.acked.get(msg.actor_id, -1), msg.version)
        self._release()

    def _release(self) -> None:
        on_ipc = [a for a in self.actors if a not in self.left]
        done = min((self.acked.get(a, -1) for a in on_ipc), default=max(self.live, default=-1))
        for version in sorted(self.live):
            old = len(self.live) > self.keep
            if version <= done or old:
                self.released_unacked += version > done
                self.released += 1
                self.provider.release(self.live.pop(version))

    def report(self) -> dict:
        return {"ipc_versions": self.exports, "export_s": round(self.export_s, 3), "released": self.released,
                "released_unacknowledged": self.released_unacked, "held": len(self.live), "failed": self.failed,
                "refused_acknowledgements": self.refused_acks,
                "actors_left": dict(self.left)}

    def close(self) -> None:
        for version in sorted(self.live):
            self.provider.release(self.live.pop(version))


class IpcReceiver:
    """An actor's end: `receive` is what the weight subscriber calls on a `WeightsIpc`; it returns {name: tensor}
    (copies on `device`, the buffer let go of), `InEngine` (`into` loaded it in the engine), or None (this actor left
    IPC: the subscriber asks over ZeroMQ).

    into(msg, handle): an engine's load of the version this actor's `handle` names (the backend's
    `receive_weight_ipc`); None: this process opens the handle and copies the tensors out (hf)."""

    def __init__(self, provider: Provider, actor_id: str, expected: dict[str, torch.Tensor], device: torch.device,
                 ack: Callable[[wire.WeightsIpcAck], None],
                 into: Callable[[wire.WeightsIpc, list], None] | None = None):
        self.provider, self.actor_id, self.device, self._ack = provider, actor_id, torch.device(device), ack
        self.into = into
        self.index = int(actor_id.rsplit("-", 1)[1])
        self.expected = {name: wire.TensorInfo.of(name, t.dtype, t.shape) for name, t in expected.items()}
        self.failed: str | None = None
        self.syncs = 0
        self.sync_s = 0.0

    def receive(self, msg: wire.WeightsIpc) -> dict[str, torch.Tensor] | None:
        """Raises WireError for a damaged manifest (the caller counts it and asks again)."""
        if self.failed is not None:
            return None
        verify(msg, self.expected, self.provider.name)
        t0 = time.perf_counter()
        handle = msg.handles[self.index] if self.index < len(msg.handles) else []
        try:
            if not handle:
                raise LookupError(f"the learner sent no handle for {self.actor_id}")
            if self.into is None:
                got = self._copy(msg, handle)
            else:
                self.into(msg, handle)
                got = InEngine()
        except Exception as e:  # noqa: BLE001  (any failure to open or load means: ZeroMQ for this actor)
            where = "in the engine" if self.into is not None else f"on {self.device}"
            reason = (f"version {msg.version}: the handle could not be opened or loaded {where} "
                      f"({type(e).__name__}: {e})")
            self.failed = reason
            log.error("weight sync ipc: %s; weights go over ZeroMQ from now on", reason)
            self._ack(wire.WeightsIpcAck(actor_id=self.actor_id, version=msg.version, ok=False, reason=reason))
            return None
        self._ack(wire.WeightsIpcAck(actor_id=self.actor_id, version=msg.version))
        self.syncs += 1
        self.sync_s += time.perf_counter() - t0
        return got

    def _copy(self, msg: wire.WeightsIpc, handle: list) -> dict[str, torch.Tensor]:
        """The version's tensors copied onto this actor's device; the buffer is let go of (the learner may free it
        once acknowledged)."""
        flat = self.provider.open(handle, self.device)
        return {name: t.to(self.device, copy=True) for name, t in views(flat, msg.tensors, msg.offsets, msg.total)}

    def report(self) -> dict:
        return {"syncs": self.syncs, "sync_s": round(self.sync_s, 3), "failed": self.failed}

    def close(self) -> None:
        pass


def _size(t: wire.TensorInfo) -> int:
    return torch.empty((), dtype=getattr(torch, t.dtype)).element_size()
