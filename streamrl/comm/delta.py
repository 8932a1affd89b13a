"""Delta weight versions (transport.weights_delta): a version sent as its difference from the previous one.

A version's flat buffer (streamrl.comm.chunks.Layout) is XORed with the previous version's, chunk by
chunk, and the XOR compressed with zstd: an element the optimizer step left alone is all zero bits, and
where only the low bits of an element moved, its high bytes are zero too, so a step at a small learning
rate (1e-6: a few per cent of bf16 elements change) shrinks to a fraction of the full version.

The learner (`DeltaEncoder`) keeps a host copy of the last version it published: the base of the next
delta, and what a full version is sent from (padding zero, so both ends' bytes agree to the bit). The
receiver (`apply`) keeps the bytes of the version it holds, XORs each decompressed chunk into them and
checks the result against the sender's CRC-32 of the new chunk: a wrong base, a lost version or a
corrupted chunk fails there, and the receiver asks for a full version instead.
"""

from __future__ import annotations

import time
import zlib

import numpy as np

from streamrl.comm import chunks, wire
from streamrl.comm.wire import WeightsChunk, WeightsDelta, WireError

LEVEL = 1  # zstd's fastest level: the XOR of a small step is mostly zero bytes, which any level packs


def _xor(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a XOR b for uint8 arrays of one length, eight bytes at a time where the length allows."""
    if len(a) % 8 == 0:
        return np.bitwise_xor(a.view(np.uint64), b.view(np.uint64)).view(np.uint8)
    return np.bitwise_xor(a, b)


def apply(payload, base: np.ndarray, header: WeightsDelta) -> np.ndarray:
    """The new chunk's bytes from its compressed XOR (`payload`) and the receiver's bytes of the same chunk of
    version `header.base` (`base`, uint8); raises WireError ("delta_corrupt": not a zstd frame of the right size,
    "delta_checksum": the bytes do not match the sender's CRC-32)."""
    import zstandard

    h = header.layout
    start = h.index * h.chunk_bytes
    n = min(h.chunk_bytes, h.total - start)
    try:
        raw = zstandard.ZstdDecompressor().decompress(bytes(payload), max_output_size=max(n, 1))
    except zstandard.ZstdError as e:
        raise WireError("delta_corrupt", f"weights version {h.version} chunk {h.index}: its delta does not "
                        f"decompress ({e})") from None
    if len(raw) != n or len(base) != n:
        raise WireError("delta_corrupt", f"weights version {h.version} chunk {h.index}: delta of {len(raw)} bytes, "
                        f"base of {len(base)}, the chunk holds {n}")
    new = _xor(np.frombuffer(raw, dtype=np.uint8), base)
    if zlib.crc32(new) != header.crc32:
        raise WireError("delta_checksum", f"weights version {h.version} chunk {h.index}: the bytes made from version "
                        f"{header.base} and the delta do not match the learner's checksum")
    return new


class DeltaEncoder:
    """The learner's end: each version as delta or full messages, and the base copy they need.

    mode "on": every version a delta but the first after a start or a layout change, those a request is
    waiting for (a new or lost actor) and every `full_every`-th; "auto": as "on", but a delta only when
    its bytes are fewer than the full version's.
    """

    def __init__(self, mode: str, full_every: int, level: int = LEVEL):
        if mode not in ("on", "auto"):
            raise ValueError(f"transport.weights_delta: {mode!r} is not a delta mode (on, auto)")
        self.mode, self.full_every, self.level = mode, full_every, level
        self.base: np.ndarray | None = None
        """The flat bytes of `base_version` (padding zero)."""
        self.base_version = -1
        self._key = None
        self._since_full = 0
        self.stats = {"full": [0, 0], "delta": [0, 0]}
        """{kind: [versions, bytes on the wire]} of the versions encoded."""
        self.encode_s = 0.0
        """Seconds spent copying, XORing and compressing."""

    def reset(self) -> None:
        """The next version goes full (the last one published did not go through this encoder)."""
        self.base_version = -1

    def encode(self, version: int, layout: chunks.Layout, tensors: list, chunk_bytes: int, learner: str,
               full: bool = False) -> tuple[str, list[list]]:
        """("full" | "delta", messages [header frame, payload frame] each) of `version` (tensors: the state's
        values in layout order, any device). The tensors are copied into the base first; the caller may change
        them once this returns. A full version's payloads are views of the base: send them before the next
        encode."""
        import torch
        import zstandard

        t0 = time.perf_counter()
        if self.base is None or self._key != layout.key:
            self.base, self._key, self.base_version = np.zeros(layout.total, dtype=np.uint8), layout.key, -1
        full = full or self.base_version < 0 or self._since_full + 1 >= self.full_every
        heads = chunks.headers(version, layout, chunk_bytes, learner)
        scratch = torch.zeros(min(chunk_bytes, layout.total), dtype=torch.uint8)
        zc = zstandard.ZstdCompressor(level=self.level)
        deltas, size = [], 0
        for h in heads:
            start = h.index * chunk_bytes
            end = min(start + chunk_bytes, layout.total)
            new = scratch[:end - start]
            chunks.copy_chunk(layout, tensors, start, new)  # padding stays zero: never written
            new_np, base = new.numpy(), self.base[start:end]
            if not full and (self.mode == "on" or size < layout.total):
                payload = zc.compress(_xor(new_np, base))
                size += len(payload)
                deltas.append((WeightsDelta(layout=h, base=self.base_version, crc32=zlib.crc32(new_np)), payload))
            base[:] = new_np
        kind = "delta" if not full and not (self.mode == "auto" and size >= layout.total) else "full"
        if kind == "delta":
            messages = [[wire.encode(d)[0], p] for d, p in deltas]
            self._since_full += 1
        else:
            slices = [self._slice(h, chunk_bytes, layout.total) for h in heads]
            messages = [[chunks.encode_chunk_header(h, [b]), b] for h, b in zip(heads, slices)]
            size, self._since_full = layout.total, 0
        self.base_version = version
        self.stats[kind][0] += 1
        self.stats[kind][1] += size
        self.encode_s += time.perf_counter() - t0
        return kind, messages

    def _slice(self, h: WeightsChunk, chunk_bytes: int, total: int) -> np.ndarray:
        start = h.index * chunk_bytes
        return self.base[start:min(start + chunk_bytes, total)]

    def report(self) -> dict:
        """For the run's summary: versions and bytes per version, full and delta apart."""
        out = {}
        for kind, (n, nbytes) in self.stats.items():
            out[f"weights_{kind}_versions"] = n
            out[f"weights_{kind}_bytes_per_version"] = nbytes / n if n else 0.0
        out["weights_delta_encode_s"] = self.encode_s
        return out
