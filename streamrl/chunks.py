"""Weights in chunks: a version of any size crosses ZeroMQ as messages under the size cap.

A version is laid out as one flat byte buffer (`Layout`: every tensor 64-byte aligned, in state
dict order) that is never built whole on the learner: the publisher copies it chunk by chunk from
the live parameters into a small `ChunkPool` of reused buffers, sends each zero-copy, and refills
a buffer only once ZeroMQ is done with it (its tracker), so a publish holds `pool × chunk` bytes
whatever the model's size, and copying chunk k+1 overlaps sending chunk k. On the other end an
`Assembly` puts one version together and hands it out only when every chunk has arrived and
agrees with the others (never a torn or mixed version).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import zmq

from streamrl import wire
from streamrl.wire import WeightsChunk, WireError

log = logging.getLogger(__name__)

_ALIGN = 64  # every tensor starts on a cache line, so typed views of the byte buffer are aligned
DEFAULT_CHUNK_BYTES = 64 << 20
POOL_BYTES = 256 << 20  # what one publish may hold on the learner, whatever the model's size
_HEADER_ROOM = 1 << 20  # room left under the message cap for a chunk's header (the layout, ~50 B a tensor)


def chunk_bytes_for(max_message_bytes: int, wanted: int = DEFAULT_CHUNK_BYTES) -> int:
    """A chunk size that fits under ZeroMQ's per-frame cap (`transport.max_message_bytes`, 0: none)."""
    if max_message_bytes <= 0:
        return wanted
    room = max_message_bytes - min(_HEADER_ROOM, max_message_bytes // 4)
    return max(_ALIGN, min(wanted, room) // _ALIGN * _ALIGN)


class Layout:
    """Where each tensor of a state dict sits in a version's flat buffer."""

    def __init__(self, state: dict):
        self.key = tuple((name, t.dtype, tuple(t.shape)) for name, t in state.items())
        self.infos = [wire.TensorInfo.of(*entry) for entry in self.key]
        self.sizes = [t.numel() * t.element_size() for t in state.values()]
        self.offsets: list[int] = []
        total = 0
        for n in self.sizes:
            self.offsets.append(total)
            total += -(-n // _ALIGN) * _ALIGN
        self.total = total
        """Bytes of the flat buffer (what one publish moves to each subscriber)."""

    def pieces(self, start: int, end: int) -> list[tuple[int, int, int, int]]:
        """(tensor index, first byte in the tensor, last byte + 1, where it goes in the chunk) for
        every tensor overlapping bytes [start, end) of the flat buffer."""
        out = []
        for i, (offset, n) in enumerate(zip(self.offsets, self.sizes)):
            a, b = max(start, offset), min(end, offset + n)
            if a < b:
                out.append((i, a - offset, b - offset, a - start))
        return out


def copy_chunk(layout: Layout, tensors: list, start: int, dst) -> None:
    """Copy bytes [start, start + dst.numel()) of the flat buffer of `tensors` (the state dict's values,
    any device) into `dst` (a uint8 CPU tensor). Padding bytes are left as they are."""
    import torch

    srcs, dsts = [], []
    for i, a, b, at in layout.pieces(start, start + dst.numel()):
        flat = tensors[i].detach().reshape(-1).view(torch.uint8)
        srcs.append(flat[a:b])
        dsts.append(dst[at:at + b - a])
    if not srcs:
        return
    with torch.no_grad():
        if all(s.device.type == "cpu" for s in srcs):
            torch._foreach_copy_(dsts, srcs)  # one call: per-tensor copies cost more in Python than in bytes
        else:
            for d, s in zip(dsts, srcs):
                d.copy_(s)


class ChunkPool:
    """`size` reused chunk buffers; `take` hands out the next one once ZeroMQ has sent it.

    A subscriber that stays connected but stops reading (a stopped process) would hold a buffer
    forever: after `stall_s` the pool lets ZeroMQ keep that buffer (it is freed when sent or when
    the peer goes) and allocates another. The PUB socket's high-water mark bounds how many a dead
    peer can hold this way.
    """

    def __init__(self, chunk_bytes: int, size: int = 4, stall_s: float = 10.0):
        self.chunk_bytes, self.size, self.stall_s = chunk_bytes, size, stall_s
        self.buffers: list = []
        self.trackers: list[list] = []
        self.abandoned = 0
        self.waited_s = 0.0
        """Seconds `take` waited for ZeroMQ to finish with a buffer (sending was slower than copying)."""
        self._next = 0

    def take(self, nbytes: int):
        """A uint8 CPU tensor of `nbytes` (≤ chunk_bytes) that nothing is sending any more."""
        import torch

        i = self._next
        self._next = (i + 1) % self.size
        if i == len(self.buffers):
            self.buffers.append(self._new(nbytes))
            self.trackers.append([])
        trackers, self.trackers[i] = self.trackers[i], []
        t0 = time.perf_counter()
        deadline = t0 + self.stall_s
        for tracker in trackers:
            try:
                tracker.wait(max(0.0, deadline - time.perf_counter()))
            except zmq.NotDone:
                if not self.abandoned:
                    log.warning("weights: a chunk was not sent within %.0fs (a subscriber that stopped reading?); "
                                "ZeroMQ keeps it and the pool allocates another", self.stall_s)
                self.abandoned += 1
                self.buffers[i] = self._new(nbytes)
                break
        self.waited_s += time.perf_counter() - t0
        if self.buffers[i].numel() < nbytes:  # a larger model than the buffers were made for
            self.buffers[i] = self._new(nbytes)
        return i, self.buffers[i][:nbytes]

    def track(self, i: int, tracker) -> None:
        self.trackers[i].append(tracker)

    def _new(self, nbytes: int):
        import torch

        # Pinned host memory makes a GPU → host copy a DMA instead of a staged one.
        return torch.empty(min(max(nbytes, 1), self.chunk_bytes), dtype=torch.uint8,
                           pin_memory=torch.cuda.is_available())


def headers(version: int, layout: Layout, chunk_bytes: int, learner: str) -> list[WeightsChunk]:
    """The chunk headers of one version, in order."""
    first = WeightsChunk(version=version, tensors=layout.infos, offsets=layout.offsets, total=layout.total,
                         chunk_bytes=chunk_bytes, sent_at=time.time(), learner=learner)
    return [first] + [WeightsChunk(version=version, tensors=layout.infos, offsets=layout.offsets, total=layout.total,
                                   chunk_bytes=chunk_bytes, index=i, sent_at=first.sent_at, learner=learner)
                      for i in range(1, first.count)]


def encode_weights(version: int, state: dict, learner: str = "", chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list:
    """Every message of one version ([header, chunk bytes] each), copied into fresh buffers: for tests
    and tools. The learner sends from a ChunkPool instead (WeightPublisher)."""
    import torch

    layout = Layout(state)
    tensors = list(state.values())
    messages = []
    for h in headers(version, layout, chunk_bytes, learner):
        start = h.index * chunk_bytes
        buf = torch.zeros(min(chunk_bytes, layout.total - start), dtype=torch.uint8)
        copy_chunk(layout, tensors, start, buf)
        messages.append([wire.encode_chunk_header(h), buf.numpy()])
    return messages


class Assembly:
    """One version being put together from its chunks (any order)."""

    def __init__(self, header: WeightsChunk, max_bytes: int):
        """Checks the version's layout once; raises WireError."""
        import torch

        if header.total > max_bytes:
            raise WireError("too_large", f"weights version {header.version} is {header.total} bytes, more than the "
                            f"{max_bytes} this subscriber accepts")
        self.entries = wire.layout(header)
        self.first = header
        self.version, self.learner, self.count = header.version, header.learner, header.count
        self.have = bytearray(self.count)
        self.missing = self.count
        self.frame = None  # a one-chunk version: its frame is the buffer (no copy)
        try:
            self.buffer = torch.empty(header.total, dtype=torch.uint8) if self.count > 1 else None
        except RuntimeError as e:  # more than this machine can hold
            raise WireError("too_large", f"weights version {header.version}: cannot allocate {header.total} bytes "
                            f"({e})") from None
        self.started = time.monotonic()

    def add(self, header: WeightsChunk, payload: memoryview, frame) -> None:
        """Take one chunk of this version (its payload checked by wire.chunk_payload); raises WireError
        ("duplicate_chunk", "chunk_mismatch") and leaves the assembly as it was."""
        first = self.first
        if (header.total, header.chunk_bytes, header.offsets) != (first.total, first.chunk_bytes, first.offsets) \
                or header.tensors != first.tensors:
            raise WireError("chunk_mismatch", f"weights version {header.version} chunk {header.index}: its layout "
                            f"differs from the version's other chunks")
        if self.have[header.index]:
            raise WireError("duplicate_chunk", f"weights version {header.version} chunk {header.index} came twice")
        if self.buffer is None:
            self.frame = frame
        elif len(payload):
            start = header.index * header.chunk_bytes
            self.buffer.numpy()[start:start + len(payload)] = np.frombuffer(payload, dtype=np.uint8)
        self.have[header.index] = 1
        self.missing -= 1

    @property
    def complete(self) -> bool:
        return self.missing == 0

    def tensors(self) -> dict:
        """{name: tensor} of the complete version (views of its buffer)."""
        assert self.complete
        buf = self.buffer.numpy().data if self.buffer is not None else wire._buffer(self.frame)
        return wire.tensors(buf, self.entries)


def decode_weights(messages: list, max_bytes: int = 1 << 40) -> tuple[int, dict]:
    """(version, {name: tensor}) from every message of one version ([header, chunk] frames each), checked
    as a WeightSubscriber checks them: for tests and tools. Raises WireError."""
    assembly = None
    for frames in messages:
        header = wire.decode_header(frames)
        if not isinstance(header, WeightsChunk):
            raise WireError("unexpected_type", f"expected weights, got {type(header).__name__}")
        payload = wire.chunk_payload(frames, header)
        if assembly is None:
            assembly = Assembly(header, max_bytes)
        elif (header.learner, header.version) != (assembly.learner, assembly.version):
            raise WireError("chunk_lost", f"weights version {assembly.version}: {assembly.missing} of {assembly.count} "
                            f"chunks never came (version {header.version} began)")
        assembly.add(header, payload, frames[1])
    if assembly is None:
        raise WireError("empty", "no weights messages")
    if not assembly.complete:
        raise WireError("chunk_lost", f"weights version {assembly.version}: {assembly.missing} of {assembly.count} "
                        "chunks never came")
    return assembly.version, assembly.tensors()
