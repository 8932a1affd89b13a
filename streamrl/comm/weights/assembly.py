"""A weights version put together on the receiving end.

On the other end an `Assembly` keeps the received frames (no copy) and hands the version out only
when every chunk has arrived and agrees with the others (never a torn or mixed version), as a
`Received` mapping: a tensor that lies inside one frame is a view of it, one cut by a chunk boundary
is put together only when read; a backend that has its own tensors (hf) has every piece copied
straight into them (`Received.copy_into`), so no byte is copied twice on the actor.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Mapping

import numpy as np

from streamrl.comm import wire
from streamrl.comm.weights import chunks
from streamrl.comm.wire import WeightsChunk, WireError


class Assembly:
    """One version being put together from its chunks (any order). The received frames are kept as
    they are (no copy) and handed out as one `Received` version once every chunk is in."""

    def __init__(self, header: WeightsChunk, max_bytes: int):
        """Checks the version's layout once; raises WireError."""
        if header.total > max_bytes:
            raise WireError("too_large", f"weights version {header.version} is {header.total} bytes, more than the "
                            f"{max_bytes} this subscriber accepts")
        self.entries = chunks.check_layout(header)
        self.first = header
        self.version, self.learner, self.count = header.version, header.learner, header.count
        self._chunks: list[list[memoryview] | None] = [None] * self.count
        self.missing = self.count
        self.started = time.monotonic()

    def add(self, header: WeightsChunk, payload: list[memoryview], checked: bool = False) -> None:
        """Take one chunk of this version (its frames checked by chunks.chunk_payload, its bytes against its checksum
        here unless `checked`: a delta's bytes, made and checked by streamrl.comm.weights.encoders); raises WireError
        ("duplicate_chunk", "chunk_mismatch", "weights_checksum") and leaves the assembly as it was."""
        first = self.first
        if (header.total, header.chunk_bytes, header.offsets) != (first.total, first.chunk_bytes, first.offsets) \
                or header.tensors != first.tensors:
            raise WireError("chunk_mismatch", f"weights version {header.version} chunk {header.index}: its layout "
                            f"differs from the version's other chunks")
        if self._chunks[header.index] is not None:
            raise WireError("duplicate_chunk", f"weights version {header.version} chunk {header.index} came twice")
        if not checked:
            chunks.check_sum(header, payload)
        self._chunks[header.index] = payload
        self.missing -= 1

    @property
    def payloads(self) -> list[list[memoryview]]:
        """Each chunk's pieces as received (the base of a delta version: streamrl.comm.weights.encoders)."""
        return self._chunks

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
        """entries: chunks.check_layout's (name, dtype, numel, offset, shape); frames: (byte offset in the flat
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
                t = chunks.view(pieces[0][1], dtype, numel, 0).view(shape)
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
                srcs.append(chunks.view(buf, torch.uint8, len(buf), 0))
        chunks.copy_all(dsts, srcs)


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
        payload = chunks.chunk_payload(frames, header)
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
