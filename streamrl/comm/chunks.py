"""Weights in chunks: a version of any size crosses ZeroMQ as messages under the size cap.

A version is laid out as one flat byte buffer (`Layout`: every tensor 64-byte aligned, in state
dict order) that is never built whole on either end. A chunk (bytes [index × chunk_bytes, +chunk_bytes)
of it) travels as one frame per piece (`pieces_of`): each tensor's share of the chunk is a view of
the tensor's own memory, sent zero-copy, and the few bytes between (padding, small tensors) are one
small copied frame. Tensors ZeroMQ cannot send in place (on a GPU, not contiguous) are copied
chunk by chunk into a small `ChunkPool` of reused buffers instead, refilled only once ZeroMQ is done
with them (their trackers), so a publish holds `pool × chunk` bytes whatever the model's size.

On the other end an `Assembly` keeps the received frames (no copy) and hands the version out only
when every chunk has arrived and agrees with the others (never a torn or mixed version), as a
`Received` mapping: a tensor that lies inside one frame is a view of it, one cut by a chunk boundary
is put together only when read; a backend that has its own tensors (hf) has every piece copied
straight into them (`Received.copy_into`), so no byte is copied twice on the actor.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Mapping

import numpy as np

from streamrl.comm import wire
from streamrl.comm.wire import WeightsChunk, WireError

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
    _copy_all(dsts, srcs)


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
    """One version being put together from its chunks (any order). The received frames are kept as
    they are (no copy) and handed out as one `Received` version once every chunk is in."""

    def __init__(self, header: WeightsChunk, max_bytes: int):
        """Checks the version's layout once; raises WireError."""
        if header.total > max_bytes:
            raise WireError("too_large", f"weights version {header.version} is {header.total} bytes, more than the "
                            f"{max_bytes} this subscriber accepts")
        self.entries = wire.layout(header)
        self.first = header
        self.version, self.learner, self.count = header.version, header.learner, header.count
        self._chunks: list[list[memoryview] | None] = [None] * self.count
        self.missing = self.count
        self.started = time.monotonic()

    def add(self, header: WeightsChunk, payload: list[memoryview]) -> None:
        """Take one chunk of this version (its frames checked by wire.chunk_payload); raises WireError
        ("duplicate_chunk", "chunk_mismatch") and leaves the assembly as it was."""
        first = self.first
        if (header.total, header.chunk_bytes, header.offsets) != (first.total, first.chunk_bytes, first.offsets) \
                or header.tensors != first.tensors:
            raise WireError("chunk_mismatch", f"weights version {header.version} chunk {header.index}: its layout "
                            f"differs from the version's other chunks")
        if self._chunks[header.index] is not None:
            raise WireError("duplicate_chunk", f"weights version {header.version} chunk {header.index} came twice")
        self._chunks[header.index] = payload
        self.missing -= 1

    @property
    def complete(self) -> bool:
        return self.missing == 0

    def tensors(self) -> Received:
        """The complete version, {name: tensor} in the learner's order."""
        assert self.complete
        frames, at = [], 0
        for payload in self._chunks:
            for buf in payload:
                if len(buf):
                    frames.append((at, buf))
                at += len(buf)
        return Received(self.entries, frames)


class Received(Mapping):
    """A complete, checked version as {name: tensor}, read from the frames it arrived in (kept, never
    written). A tensor inside one frame is a view of it; one cut by chunk boundaries is put together
    the first time it is read. `copy_into` copies every tensor, cut or not, straight from the frames
    into a backend's own tensors: one copy of each byte, and no version-sized buffer besides."""

    def __init__(self, entries: list, frames: list[tuple[int, memoryview]]):
        """entries: wire.layout's (name, dtype, numel, offset, shape); frames: (byte offset in the flat
        buffer, bytes), in order, together covering it."""
        self._entries = {e[0]: e for e in entries}
        self._frames = frames
        self._starts = [at for at, _ in frames]
        self._made: dict = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self):
        return iter(self._entries)

    def __getitem__(self, name: str):
        t = self._made.get(name)
        if t is None:
            import torch

            _, dtype, numel, _, shape = self._entries[name]
            pieces = self.pieces(name)
            if not numel:
                t = torch.empty(shape, dtype=dtype)
            elif len(pieces) == 1 and _address(pieces[0][1]) % dtype.itemsize == 0:
                t = wire._view(pieces[0][1], dtype, numel, 0).view(shape)
            else:
                whole = np.empty(numel * dtype.itemsize, dtype=np.uint8)
                for at, buf in pieces:
                    whole[at:at + len(buf)] = np.frombuffer(buf, dtype=np.uint8)
                t = torch.from_numpy(whole).view(dtype).view(shape)
            t = self._made[name] = t
        return t

    def pieces(self, name: str) -> list[tuple[int, memoryview]]:
        """(first byte in the tensor, bytes) of every received piece of tensor `name`, in order."""
        _, dtype, numel, offset, _ = self._entries[name]
        end = offset + numel * dtype.itemsize
        out = []
        k = max(0, bisect.bisect_right(self._starts, offset) - 1)
        while k < len(self._frames) and self._starts[k] < end:
            at, buf = self._frames[k]
            a, b = max(offset, at), min(end, at + len(buf))
            if a < b:
                out.append((a - offset, buf[a - at:b - at]))
            k += 1
        return out

    def copy_into(self, dst: Mapping) -> None:
        """Copy every tensor into `dst[name]` (the same names, dtypes and shapes; any device), each piece
        straight from its frame. Raises ValueError naming what differs, before anything is copied."""
        import torch

        if set(dst) != set(self._entries):
            missing, unexpected = sorted(set(dst) - set(self._entries)), sorted(set(self._entries) - set(dst))
            raise ValueError(f"weights: the version's tensors differ from the model's (missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]})")
        for name, (_, dtype, _, _, shape) in self._entries.items():
            d = dst[name]
            if d.dtype != dtype or tuple(d.shape) != tuple(shape):
                raise ValueError(f"weights: {name} is {dtype} {list(shape)} in the version, {d.dtype} "
                                 f"{list(d.shape)} in the model")
        dsts, srcs = [], []
        for name in self._entries:
            d = dst[name].detach()
            if not d.is_contiguous():
                dsts.append(d)
                srcs.append(self[name])
                continue
            flat = d.reshape(-1).view(torch.uint8)
            for at, buf in self.pieces(name):
                dsts.append(flat[at:at + len(buf)])
                srcs.append(wire._view(buf, torch.uint8, len(buf), 0))
        _copy_all(dsts, srcs)


def _copy_all(dsts: list, srcs: list) -> None:
    """dst.copy_(src) for every pair: one call for CPU tensors (per-tensor calls cost more in Python
    than in bytes), one at a time across devices."""
    import torch

    if not srcs:
        return
    with torch.no_grad():
        if all(t.device.type == "cpu" for t in (*dsts, *srcs)):
            torch._foreach_copy_(dsts, srcs)
        else:
            for d, s in zip(dsts, srcs):
                d.copy_(s)


def _address(buf: memoryview) -> int:
    """Memory address of `buf`'s first byte (typed views of received frames must be aligned)."""
    return np.frombuffer(buf, dtype=np.uint8, count=1).ctypes.data


def decode_weights(messages: list, max_bytes: int = 1 << 40) -> tuple[int, Received]:
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
