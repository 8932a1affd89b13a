"""Weights in chunks: a version of any size crosses ZeroMQ as messages under the size cap.

A version is laid out as one flat byte buffer (`Layout`: every tensor 64-byte aligned, in state
dict order) that is never built whole on either end. A chunk (bytes [index × chunk_bytes, +chunk_bytes)
of it) travels as one frame per piece (`pieces_of`): each tensor's share of the chunk is a view of
the tensor's own memory, sent zero-copy, and the few bytes between (padding, small tensors) are one
small copied frame. Tensors ZeroMQ cannot send in place (on a GPU, not contiguous) are copied
chunk by chunk into a small `ChunkPool` of reused buffers instead, refilled only once ZeroMQ is done
with them (their trackers), so a publish holds `pool × chunk` bytes whatever the model's size.

On the other end an `Assembly` keeps the received frames (no copy) and hands the version out only
when every chunk has arrived and agrees with the others (never a torn or mixed version); a tensor
that lies inside one frame is a view of it, only one cut by a chunk boundary is copied together.
"""

from __future__ import annotations

import bisect
import logging
import time

import numpy as np

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


ZERO_COPY_MIN = 64 * 1024  # a tracked zero-copy frame costs ~25 µs; a smaller piece is copied in far less


def in_place(t) -> bool:
    """Whether ZeroMQ can send this tensor's bytes straight from its memory (a contiguous CPU tensor)."""
    return t.device.type == "cpu" and t.is_contiguous()


def _bytes_of(t):
    """The tensor's bytes as a flat uint8 numpy array sharing its memory."""
    import torch

    return t.detach().reshape(-1).view(torch.uint8).numpy()


def pieces_of(layout: Layout, tensors: list, start: int, end: int) -> list | None:
    """The frames carrying bytes [start, end) of the flat buffer of `tensors`, in order: a view of a
    tensor's own memory for each piece of at least ZERO_COPY_MIN bytes (sent zero-copy), and the bytes
    between them (padding, small tensors) as small bytes frames. None if a tensor there cannot be sent
    in place (`in_place`): then the chunk is copied into a pool buffer."""
    frames: list = []
    small, at = bytearray(), start
    for i, a, b, pos in layout.pieces(start, end):
        t = tensors[i]
        if not in_place(t):
            return None
        small += bytes(start + pos - at)  # padding before this tensor
        view = _bytes_of(t)[a:b]
        if b - a >= ZERO_COPY_MIN:
            if small:
                frames.append(bytes(small))
                small = bytearray()
            frames.append(view)
        else:
            small += view.tobytes()
        at = start + pos + b - a
    small += bytes(end - at)
    if small or not frames:
        frames.append(bytes(small))
    return frames


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
    """`size` reused chunk buffers for tensors that cannot be sent in place (on a GPU, not contiguous),
    taken round robin; each remembers the trackers of the sends still reading it, which the caller
    waits for before refilling it (WeightPublisher._wait_sent: one rule for a stalled subscriber)."""

    def __init__(self, chunk_bytes: int, size: int = 4):
        self.chunk_bytes, self.size = chunk_bytes, size
        self.buffers: list = []
        self.trackers: list[list] = []
        self._next = 0

    def take(self, nbytes: int) -> tuple[int, object, list]:
        """(index, a uint8 CPU tensor of `nbytes` ≤ chunk_bytes, trackers to wait for before writing it)."""
        i = self._next
        self._next = (i + 1) % self.size
        if i == len(self.buffers):
            self.buffers.append(self._new(nbytes))
            self.trackers.append([])
        if self.buffers[i].numel() < nbytes:  # a larger model than the buffers were made for
            self.buffers[i] = self._new(nbytes)
        trackers, self.trackers[i] = self.trackers[i], []
        return i, self.buffers[i][:nbytes], trackers

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


def encode_weights(version: int, state: dict, learner: str = "", chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                   in_pieces: bool = False) -> list:
    """Every message of one version ([header, chunk bytes] each, copied into fresh buffers; in_pieces:
    [header, *pieces_of(...)] as the WeightPublisher sends them): for tests and tools."""
    import torch

    layout = Layout(state)
    tensors = list(state.values())
    messages = []
    for h in headers(version, layout, chunk_bytes, learner):
        start = h.index * chunk_bytes
        end = min(start + chunk_bytes, layout.total)
        frames = pieces_of(layout, tensors, start, end) if in_pieces else None
        if frames is None:
            buf = torch.zeros(end - start, dtype=torch.uint8)
            copy_chunk(layout, tensors, start, buf)
            frames = [buf.numpy()]
        messages.append([wire.encode_chunk_header(h), *frames])
    return messages


class Assembly:
    """One version being put together from its chunks (any order). A tensor that lies inside one
    received frame becomes a view of it (no copy); one cut by a chunk boundary is copied together
    piece by piece as its chunks arrive (overlapping the receipt of the next ones)."""

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
        self._offsets = [e[3] for e in self.entries]
        self._out = {name: torch.empty(shape, dtype=dtype)  # no bytes: no chunk brings them
                     for name, dtype, numel, _, shape in self.entries if not numel * dtype.itemsize}
        self._cut: dict[int, np.ndarray] = {}  # tensor index -> its bytes, being put together
        self.started = time.monotonic()

    def add(self, header: WeightsChunk, payload: list[memoryview]) -> None:
        """Take one chunk of this version (its frames checked by wire.chunk_payload); raises WireError
        ("duplicate_chunk", "chunk_mismatch") and leaves the assembly as it was."""
        first = self.first
        if (header.total, header.chunk_bytes, header.offsets) != (first.total, first.chunk_bytes, first.offsets) \
                or header.tensors != first.tensors:
            raise WireError("chunk_mismatch", f"weights version {header.version} chunk {header.index}: its layout "
                            f"differs from the version's other chunks")
        if self.have[header.index]:
            raise WireError("duplicate_chunk", f"weights version {header.version} chunk {header.index} came twice")
        at = header.index * header.chunk_bytes
        for buf in payload:
            if len(buf):
                self._take(at, buf)
            at += len(buf)
        self.have[header.index] = 1
        self.missing -= 1

    def _take(self, at: int, buf: memoryview) -> None:
        """Bytes [at, at + len(buf)) of the flat buffer: a view of each tensor inside them, a copy of the
        pieces of the others."""
        end = at + len(buf)
        k = max(0, bisect.bisect_right(self._offsets, at) - 1)
        while k < len(self.entries) and self._offsets[k] < end:
            name, dtype, numel, offset, shape = self.entries[k]
            nbytes = numel * dtype.itemsize
            a, b = max(at, offset), min(end, offset + nbytes)
            if a < b:
                if (a, b) == (offset, offset + nbytes) and _address(buf, a - at) % dtype.itemsize == 0:
                    self._out[name] = wire._view(buf, dtype, numel, a - at).view(shape)
                else:
                    whole = self._cut.get(k)
                    if whole is None:
                        whole = self._cut[k] = np.empty(nbytes, dtype=np.uint8)
                    whole[a - offset:b - offset] = np.frombuffer(buf, dtype=np.uint8, count=b - a, offset=a - at)
            k += 1

    @property
    def complete(self) -> bool:
        return self.missing == 0

    def tensors(self) -> dict:
        """{name: tensor} of the complete version, in the learner's order."""
        import torch

        assert self.complete
        for k, whole in self._cut.items():
            name, dtype, _, _, shape = self.entries[k]
            self._out[name] = torch.from_numpy(whole).view(dtype).view(shape)
        return {name: self._out[name] for name, *_ in self.entries}


def _address(buf: memoryview, offset: int) -> int:
    """Memory address of byte `offset` of `buf` (typed views of received frames must be aligned)."""
    return np.frombuffer(buf, dtype=np.uint8, count=0 if offset == len(buf) else 1, offset=offset).ctypes.data


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
        assembly.add(header, payload)
    if assembly is None:
        raise WireError("empty", "no weights messages")
    if not assembly.complete:
        raise WireError("chunk_lost", f"weights version {assembly.version}: {assembly.missing} of {assembly.count} "
                        "chunks never came")
    return assembly.version, assembly.tensors()
