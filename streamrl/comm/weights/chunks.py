"""Weights in chunks: a version of any size crosses ZeroMQ as messages under the size cap.

A version is laid out as one flat byte buffer (`Layout`: every tensor 64-byte aligned, in state
dict order) that is never built whole on either end. A chunk (bytes [index × chunk_bytes, +chunk_bytes)
of it) travels as one frame per piece (`pieces_of`): each tensor's share of the chunk is a view of
the tensor's own memory, sent zero-copy, and the few bytes between (padding, small tensors) are one
small copied frame. Tensors ZeroMQ cannot send in place (on a GPU, not contiguous) are copied
chunk by chunk into a small `ChunkPool` of reused buffers instead, refilled only once ZeroMQ is done
with them (their trackers), so a publish holds `pool × chunk` bytes whatever the model's size.

The receiving end checks each chunk (`chunk_payload`), a version's layout once (`check_layout`) and each
chunk's bytes against the checksum the sender put in its header (`check_sum`); streamrl.comm.weights.assembly puts the
version together.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Sequence

import msgspec

from streamrl.comm import wire
from streamrl.comm.wire import TensorInfo, WeightsChunk, WireError

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
    any device) into `dst` (a uint8 CPU tensor). Padding bytes are zeroed: a reused buffer's old bytes there would
    make two sends of one version differ, which a delta version's checksum (streamrl.comm.weights.encoders) would
    refuse."""
    import torch

    srcs, dsts, at_end = [], [], 0
    for i, a, b, at in layout.pieces(start, start + dst.numel()):
        flat = tensors[i].detach().reshape(-1).view(torch.uint8)
        srcs.append(flat[a:b])
        dsts.append(dst[at:at + b - a])
        dst[at_end:at].zero_()
        at_end = at + b - a
    dst[at_end:].zero_()
    copy_all(dsts, srcs)


def copy_all(dsts: list, srcs: list) -> None:
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


class ChunkPool:
    """`size` reused chunk buffers for tensors that cannot be sent in place (on a GPU, not contiguous),
    taken round robin; each remembers the trackers of the sends still reading it, which the caller
    waits for before refilling it (WeightPublisher.wait_sent: one rule for a stalled subscriber)."""

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
        messages.append([encode_chunk_header(h, frames), *frames])
    return messages


def checksum(bufs: Sequence) -> int:
    """XXH3-64 of the bytes of `bufs` (buffers, in order) taken as one: a chunk's checksum, whatever pieces carry it.
    XXH3 rather than CRC-32: it reads ~2-10x faster (docs/reference/benchmarks.md), and every byte of every
    version is read once more on each end."""
    import xxhash

    h = xxhash.xxh3_64()
    for b in bufs:
        h.update(b)
    return h.intdigest()


def encode_chunk_header(header: WeightsChunk, frames: Sequence) -> bytes:
    """Frame 0 of a full chunk whose bytes are `frames`: the header with their checksum."""
    return wire.encode(msgspec.structs.replace(header, checksum=checksum(frames)))[0]


def check_sum(header: WeightsChunk, payload: Sequence) -> None:
    """Raises WireError("weights_checksum") unless `payload` (a full chunk's bytes) matches its header's checksum."""
    if header.checksum is None:
        raise WireError("weights_checksum", f"weights version {header.version} chunk {header.index}: no checksum "
                        "(every full chunk carries one)")
    if checksum(payload) != header.checksum:
        raise WireError("weights_checksum", f"weights version {header.version} chunk {header.index}: its bytes do not "
                        "match the learner's checksum (damaged on the way)")


def chunk_payload(frames: Sequence, header: WeightsChunk) -> list[memoryview]:
    """The bytes of one weights chunk (frames 1.., which together hold them in order), checked against
    its header's own fields (index, sizes, version); the layout is checked once per version (`check_layout`).
    Raises WireError."""
    # A chunk's frames are pieces of its tensors and the bytes between them: at most two per tensor, plus one.
    if not 2 <= len(frames) <= 2 * len(header.tensors) + 2:
        raise WireError("frame_count", f"weights chunk needs 2 to {2 * len(header.tensors) + 2} frames for its "
                        f"{len(header.tensors)} tensors, got {len(frames)}")
    if header.version < 0:
        raise WireError("bad_version", f"weights version {header.version} < 0")
    if header.chunk_bytes < 1 or header.total < 0:
        raise WireError("bad_chunk", f"weights version {header.version}: chunk_bytes {header.chunk_bytes}, "
                        f"total {header.total} (need chunk_bytes ≥ 1, total ≥ 0)")
    if not 0 <= header.index < header.count:
        raise WireError("bad_chunk", f"weights version {header.version}: chunk {header.index} of {header.count}")
    bufs = [wire.buffer(f) for f in frames[1:]]
    start = header.index * header.chunk_bytes
    expected = min(header.chunk_bytes, header.total - start)
    got = sum(len(b) for b in bufs)
    if got != expected:
        raise WireError("length_mismatch", f"weights version {header.version} chunk {header.index}: {got} bytes, "
                        f"its place in the {header.total}-byte version holds {expected}")
    return bufs


# Padding the flat layout may put after a tensor (the learner aligns tensors to 64 bytes); more is rejected,
# so a version cannot carry bytes no tensor accounts for.
_MAX_PAD = 64


def check_layout(header: WeightsChunk) -> list[tuple[str, object, int, int, list[int]]]:
    """(name, torch dtype, numel, byte offset, shape) of every tensor of a version, checked against its
    `total` bytes; raises WireError("bad_offset" | "length_mismatch" | "duplicate_tensor" | ...)."""
    offsets = header.offsets
    if len(offsets) != len(header.tensors):
        raise WireError("bad_offset", f"{len(offsets)} offsets for {len(header.tensors)} tensors")
    out, seen, end = [], set(), 0
    for info, offset in zip(header.tensors, offsets):
        dtype, numel = _tensor_type(info, seen)
        seen.add(info.name)
        if offset < end:
            raise WireError("bad_offset", f"tensor {info.name!r} at byte {offset} overlaps the previous one "
                            f"(ends at {end}) or goes backwards")
        if offset - end > _MAX_PAD:
            raise WireError("bad_offset", f"tensor {info.name!r} at byte {offset}: {offset - end} unused bytes before "
                            f"it (at most {_MAX_PAD})")
        if offset % dtype.itemsize:
            raise WireError("bad_offset", f"tensor {info.name!r} at byte {offset} is not aligned to its "
                            f"{dtype.itemsize}-byte dtype")
        end = offset + numel * dtype.itemsize
        if end > header.total:
            raise WireError("bad_offset", f"tensor {info.name!r} ends at byte {end}, past the {header.total}-byte "
                            "version")
        out.append((info.name, dtype, numel, offset, info.shape))
    if header.total - end > _MAX_PAD:
        raise WireError("length_mismatch", f"weights version is {header.total} bytes, its tensors end at {end}")
    return out


def _tensor_type(info: TensorInfo, seen: dict):
    """(torch dtype, numel) of a tensor header entry, checked; WireError if not a valid new tensor."""
    import torch

    if info.name in seen:
        raise WireError("duplicate_tensor", f"tensor {info.name!r} appears twice")
    if any(d < 0 for d in info.shape):
        raise WireError("bad_shape", f"tensor {info.name!r} has shape {info.shape}")
    dtype = getattr(torch, info.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise WireError("bad_dtype", f"tensor {info.name!r} has unknown dtype {info.dtype!r}")
    return dtype, math.prod(info.shape)


def view(buf: memoryview, dtype, numel: int, offset: int):
    """A (numel,) tensor sharing memory with `buf` from byte `offset` (no copy)."""
    import warnings

    import torch

    if not numel:
        return torch.empty(0, dtype=dtype)
    with warnings.catch_warnings():  # received buffers are read-only; we only ever copy out of them
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(buf, dtype=dtype, count=numel, offset=offset)
