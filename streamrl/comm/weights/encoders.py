"""How a weights version goes on the wire: one interface (`Encoder`), three encoders (transport.weights_delta and
weights_host_copy).

The publisher (streamrl.comm.weights.publisher) hands every send to its encoder and never asks which one it has:
`job` picks, on the caller's thread, what to send and returns the send to run on the publishing thread.

- `FullEncoder` ("off"): every version in full, each chunk sent zero-copy from the parameters' own memory (or from a
  pool buffer it is copied into: `send_state`), so the learner waits until nothing sent reads them.
- `HostCopyEncoder` ("off" with transport.weights_host_copy): every version copied whole into host memory first
  (pinned: a DMA from a GPU), then sent in full from that copy, so the learner waits for the copy, and for the network
  only once it has skipped `run_ahead` versions behind one send.
- `DeltaEncoder` ("on", "auto"): every version copied into a host base first, as `HostCopyEncoder` does, then sent as
  its difference from the previous version (or in full).

A delta: a version's flat buffer (streamrl.comm.weights.chunks.Layout) is XORed with the previous version's, chunk
by chunk, and the XOR compressed with zstd: an element the optimizer step left alone is all zero bits, and where
only the low bits of an element moved, its high bytes are zero too, so a step at a small learning rate (1e-6: a few
per cent of bf16 elements change) shrinks to a fraction of the full version.

The learner (`DeltaEncoder`) keeps a host copy of the last version it published: the base of the next delta, and
what a full version is sent from (padding zero, so both ends' bytes agree to the bit). The receiver (`apply`)
keeps the bytes of the version it holds, XORs each decompressed chunk into them and checks the result against the
sender's CRC-32 of the new chunk: a wrong base, a lost version or a corrupted chunk fails there, and the receiver
asks for a full version instead.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
import zlib
from typing import Callable, Protocol

import numpy as np

from streamrl.comm import wire
from streamrl.comm.weights import chunks
from streamrl.comm.wire import WeightsChunk, WeightsDelta, WireError

log = logging.getLogger(__name__)

LEVEL = 1  # zstd's fastest level: the XOR of a small step is mostly zero bytes, which any level packs


class Link(Protocol):
    """What an encoder sends through (the publisher's broadcast socket), on the publishing thread."""

    chunk_bytes: int
    session: str
    pool: chunks.ChunkPool
    copy_s: float
    sent: dict[str, int]

    def send_chunk(self, header: bytes, frames: list) -> list:
        """Send one chunk message; returns the trackers of the frames sent zero-copy."""

    def wait_sent(self, trackers: list) -> None:
        """Wait until ZeroMQ is done with these frames (a subscriber that stopped reading is dropped)."""


class Encoder(Protocol):
    """How the publisher's versions go on the wire."""

    detached: bool
    """True: a version is copied off the parameters before it is sent, so the learner need not wait for the network,
    and a version whose send has not begun when the learner moves on may be skipped (the next goes from the last one
    sent). False: chunks are sent from the parameters themselves, and the learner waits until they are out."""
    run_ahead: int | None
    """Detached: how many versions past the one being sent the learner may skip before it waits for that send (None:
    any number)."""

    def job(self, link: Link, version: int, state: dict, layout: chunks.Layout, copied: threading.Event,
            fresh: bool, asked_have: int) -> Callable[[], None]:
        """The send of `version` (`state`, laid out as `layout`) to run on the publishing thread, chosen on the
        caller's; it sets `copied` once nothing it sends reads `state`. fresh: a new version (else a re-broadcast,
        in full); asked_have: the oldest version the actors that wait for this send hold."""

    def reset(self) -> None:
        """The version just published went another way (the collective sync)."""

    def report(self, skipped: int = 0) -> dict:
        """For the run's summary (skipped: versions the publisher skipped)."""


def make(mode: str, full_every: int, host_copy: int | None = None) -> Encoder:
    """The encoder for transport.weights_delta `mode` ("off", "on", "auto"); host_copy: with "off", copy each version
    whole into host memory before sending it, skipping at most this many versions behind a send (None: send from the
    parameters)."""
    if mode != "off":
        return DeltaEncoder(mode, full_every)
    return FullEncoder() if host_copy is None else HostCopyEncoder(host_copy)


def send_state(link: Link, version: int, state: dict, layout: chunks.Layout, copied: threading.Event) -> None:
    """On the publishing thread: each chunk of `state` sent in full, zero-copy from the tensors' own memory (or, for
    tensors that cannot be sent in place, from a pool buffer it is copied into). `copied` is set once nothing sent
    refers to `state` any more: every copy made and every in-place frame sent. At most pool.size chunks are in
    flight (what a stalled subscriber can hold back)."""
    try:
        tensors = list(state.values())
        heads = chunks.headers(version, layout, link.chunk_bytes, link.session)
        in_flight: collections.deque[tuple[list, bool]] = collections.deque()  # (trackers, reads `state`)
        for h in heads:
            start = h.index * link.chunk_bytes
            end = min(start + link.chunk_bytes, layout.total)
            while len(in_flight) >= link.pool.size:
                link.wait_sent(in_flight.popleft()[0])
            frames, pooled = chunks.pieces_of(layout, tensors, start, end), None
            if frames is None:
                pooled, buf, reading = link.pool.take(end - start)
                link.wait_sent(reading)
                t0 = time.perf_counter()
                chunks.copy_chunk(layout, tensors, start, buf)
                link.copy_s += time.perf_counter() - t0
                frames = [buf.numpy()]
            trackers = link.send_chunk(chunks.encode_chunk_header(h, frames), frames)
            for tracker in trackers if pooled is not None else ():
                link.pool.track(pooled, tracker)
            in_flight.append((trackers, pooled is None))
        for trackers, reads_state in in_flight:  # the parameters may change once no frame reads them
            if reads_state:
                link.wait_sent(trackers)  # chunk by chunk: `stall_s` is for one chunk, not the whole tail
    finally:
        copied.set()


class FullEncoder:
    """transport.weights_delta "off": every version in full, sent from the parameters themselves (`send_state`)."""

    detached = False
    run_ahead = None

    def job(self, link: Link, version: int, state: dict, layout: chunks.Layout, copied: threading.Event,
            fresh: bool, asked_have: int) -> Callable[[], None]:
        link.sent["full"] += layout.total
        return functools.partial(send_state, link, version, state, layout, copied)

    def reset(self) -> None:
        pass  # every version goes in full: nothing depends on the one before

    def report(self, skipped: int = 0) -> dict:
        return {}


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


class HostCopyEncoder(FullEncoder):
    """Every version copied whole into a host buffer (the base) on the publishing thread, then `copied` is set and the
    version is sent in full from the base. The learner's `settle` waits for the copy (for weights on a GPU, a DMA into
    pinned memory), not for the network, while the versions it publishes behind a send still going on number at most
    `run_ahead`: those are skipped (`detached`); the next one waits for that send, then for its own copy. A skipped
    version is one more version the actors run behind, so `run_ahead` comes from the staleness the run allows. A
    re-broadcast of the base's version goes from the base; one of another version (it went another way) from the
    parameters, as `FullEncoder` sends it. Costs one host copy of the published weights."""

    detached = True
    pinned = True
    """The base in pinned memory where CUDA is: the versions are copied into it straight from the GPU."""

    def __init__(self, run_ahead: int | None = None):
        self.run_ahead = run_ahead
        self.base: np.ndarray | None = None
        """The flat bytes of `base_version` (padding zero)."""
        self._base_t = None  # the tensor `base` views
        self.base_version = -1
        self._key = None
        self.copy_s = 0.0
        """Seconds spent copying versions into the base."""

    def reset(self) -> None:
        """The base is not the version just published (it went another way)."""
        self.base_version = -1

    def job(self, link: Link, version: int, state: dict, layout: chunks.Layout, copied: threading.Event,
            fresh: bool, asked_have: int) -> Callable[[], None]:
        if fresh:
            return self._fresh(link, version, state, layout, copied, asked_have)
        if self.base_version == version:
            copied.set()  # a re-broadcast from the base: the learner never waits for this send either
            return functools.partial(self._send_base, link, version, layout)
        return super().job(link, version, state, layout, copied, fresh, asked_have)

    def _fresh(self, link: Link, version: int, state: dict, layout: chunks.Layout, copied: threading.Event,
               asked_have: int) -> Callable[[], None]:
        return functools.partial(self._copy_and_send, link, version, state, layout, copied)

    def _copy_and_send(self, link: Link, version: int, state: dict, layout: chunks.Layout,
                       copied: threading.Event) -> None:
        """On the publishing thread: the version copied into the base (then `copied` is set), and sent from it."""
        try:
            t0 = time.perf_counter()
            base = self._base(layout)
            self.base_version = -1  # a copy that fails midway leaves no version in the base
            chunks.copy_chunk(layout, list(state.values()), 0, base)
            self.base_version = version
            self.copy_s += time.perf_counter() - t0
        finally:
            copied.set()
        self._send_base(link, version, layout)

    def _base(self, layout: chunks.Layout):
        """The base as a zeroed uint8 CPU tensor of layout.total bytes (made, or made anew with no version in it for
        a new layout): pinned where CUDA is and `pinned`, so a GPU → host copy is a DMA; `self.base` is its numpy
        view."""
        import torch

        if self.base is None or self._key != layout.key:
            self._base_t = self.base = None  # the old one freed before the new one is made
            self._key, self.base_version = layout.key, -1
            try:
                t = torch.zeros(layout.total, dtype=torch.uint8, pin_memory=self.pinned and torch.cuda.is_available())
            except RuntimeError as e:  # pinned memory is limited (ulimit -l, containers): pageable still works
                log.warning("weights: no pinned host memory for a %.2f GB copy of the weights (%s); using "
                            "pageable memory, which copies from the GPU more slowly", layout.total / 1e9, e)
                t = torch.zeros(layout.total, dtype=torch.uint8)
            self._base_t, self.base = t, t.numpy()
        return self._base_t

    def _send_base(self, link: Link, version: int, layout: chunks.Layout) -> None:
        """On the publishing thread: the version the base holds, sent in full from it (the next copy runs on this
        thread, so only after this send)."""
        heads = chunks.headers(version, layout, link.chunk_bytes, link.session)
        trackers = []
        for h in heads:
            frames = [self._slice(h, link.chunk_bytes, layout.total)]
            trackers += link.send_chunk(chunks.encode_chunk_header(h, frames), frames)
        link.sent["full"] += layout.total
        link.wait_sent(trackers)

    def _slice(self, h: WeightsChunk, chunk_bytes: int, total: int) -> np.ndarray:
        start = h.index * chunk_bytes
        return self.base[start:min(start + chunk_bytes, total)]

    def report(self, skipped: int = 0) -> dict:
        """For the run's summary: the seconds spent copying versions to the host, and the versions skipped."""
        return {"weights_host_copy_s": self.copy_s, "weights_versions_skipped": skipped}


class DeltaEncoder(HostCopyEncoder):
    """The learner's end: each version as delta or full messages, and the base copy they need.

    mode "on": every version a delta but the first after a start or a layout change, those a request is
    waiting for (a new or lost actor) and every `full_every`-th; "auto": as "on", but a delta only when
    its bytes are fewer than the full version's. Re-broadcasts go as `HostCopyEncoder` sends them.
    """

    pinned = False  # each chunk is copied off the GPU into a scratch buffer, then XORed with the base

    def __init__(self, mode: str, full_every: int, level: int = LEVEL):
        if mode not in ("on", "auto"):
            raise ValueError(f"transport.weights_delta: {mode!r} is not a delta mode (on, auto)")
        super().__init__()  # any number of versions skipped: a delta is small, and only a slow or dead link holds one
        self.mode, self.full_every, self.level = mode, full_every, level
        self._since_full = 0
        self.stats = {"full": [0, 0], "delta": [0, 0]}
        """{kind: [versions, bytes on the wire]} of the versions encoded."""
        self.encode_s = 0.0
        """Seconds spent copying, XORing and compressing."""

    def _fresh(self, link: Link, version: int, state: dict, layout: chunks.Layout, copied: threading.Event,
               asked_have: int) -> Callable[[], None]:
        full = asked_have < self.base_version  # an asker lacks the base
        return functools.partial(self._encode_and_send, link, version, state, layout, copied, full)

    def _encode_and_send(self, link: Link, version: int, state: dict, layout: chunks.Layout,
                         copied: threading.Event, full: bool) -> None:
        """On the publishing thread: the version copied into the base (then `copied` is set) and sent as a delta or
        in full (from the base, which the next encode may change only once this is sent)."""
        try:
            kind, messages = self.encode(version, layout, list(state.values()), link.chunk_bytes, link.session, full)
        finally:
            copied.set()
        link.sent[kind] += sum(memoryview(f).nbytes for _, *frames in messages for f in frames)
        trackers = []
        for header, *frames in messages:
            trackers += link.send_chunk(header, frames)
        link.wait_sent(trackers)

    def encode(self, version: int, layout: chunks.Layout, tensors: list, chunk_bytes: int, learner: str,
               full: bool = False) -> tuple[str, list[list]]:
        """("full" | "delta", messages [header frame, payload frame] each) of `version` (tensors: the state's
        values in layout order, any device). The tensors are copied into the base first; the caller may change
        them once this returns. A full version's payloads are views of the base: send them before the next
        encode."""
        import torch
        import zstandard

        t0 = time.perf_counter()
        self._base(layout)
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

    def report(self, skipped: int = 0) -> dict:
        """For the run's summary: versions and bytes per version, full and delta apart, and the versions skipped."""
        out = {}
        for kind, (n, nbytes) in self.stats.items():
            out[f"weights_{kind}_versions"] = n
            out[f"weights_{kind}_bytes_per_version"] = nbytes / n if n else 0.0
        out["weights_delta_encode_s"] = self.encode_s
        out["weights_versions_skipped"] = skipped
        return out
