"""Reused copies of the weights for the learner to send without copying again.

ZeroMQ sends a zero-copy frame from the caller's memory after `send` returns, and training updates
the parameters in place, so what goes out must be a copy that nothing writes to until ZeroMQ is
done with it: otherwise an actor could load a torn mix of two versions. A `SnapshotPool` keeps a
few such copies and refills one that no message still uses (ZeroMQ's trackers say so) and that is
not the newest (late joiners are still served from it). Refilling is one fused copy into memory
that is already paged in, instead of a fresh tensor per parameter; the frames are views made once.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)

_ALIGN = 64  # every tensor starts on a cache line, so typed views of the byte buffer are aligned


class Snapshot:
    """One copy of a state dict: a flat byte buffer, a typed view per tensor, and the frames."""

    def __init__(self, layout: tuple[tuple[str, object, tuple[int, ...]], ...]):
        import torch

        sizes = [torch.Size(shape).numel() * dtype.itemsize for _, dtype, shape in layout]
        offsets, total = [], 0
        for n in sizes:
            offsets.append(total)
            total += -(-n // _ALIGN) * _ALIGN
        self.buffer = torch.empty(total, dtype=torch.uint8)
        self.offsets = offsets
        """Byte offset of each tensor in `buffer` (what a flat WeightsHeader carries)."""
        self.frame = self.buffer.numpy()
        """The whole buffer as one uint8 array: the flat weights message's single bulk frame."""
        self.tensors = [self.buffer[o:o + n].view(dtype).view(shape)
                        for o, n, (_, dtype, shape) in zip(offsets, sizes, layout)]
        """Views of `buffer` shaped like the state dict's tensors, in its order."""
        self.frames = [self.buffer[o:o + n].numpy() for o, n in zip(offsets, sizes)]
        """One uint8 array per tensor, views of `buffer` (the per-tensor layout's bulk frames)."""
        self.trackers: list = []
        """zmq.MessageTrackers of every frame sent from this copy and maybe not yet sent."""
        self._lock = threading.Lock()  # the publisher's sending thread and the request server both add trackers

    def track(self, tracker) -> None:
        with self._lock:
            self.trackers.append(tracker)

    @property
    def in_flight(self) -> bool:
        with self._lock:
            self.trackers = [t for t in self.trackers if not t.done]
            return bool(self.trackers)


class SnapshotPool:
    """Copies of one state dict layout; `fill` never writes to a copy ZeroMQ may still be sending.

    Memory: a copy stays busy only while a message holds it, and the sockets' high-water marks bound
    the messages; past `keep` copies the pool forgets the oldest busy one (ZeroMQ holds a reference
    until it is sent, then it is freed) instead of waiting for it.
    """

    def __init__(self, keep: int = 4):
        self.keep = keep
        self.layout: tuple | None = None
        self.copies: list[Snapshot] = []
        self.newest: Snapshot | None = None
        self.allocated = 0
        self.dropped = 0

    def fill(self, state: dict) -> Snapshot:
        """A snapshot holding a copy of `state` ({name: tensor}, any device), now the newest."""
        import torch

        layout = tuple((name, t.dtype, tuple(t.shape)) for name, t in state.items())
        if layout != self.layout:  # another model: the old copies no longer fit
            self.layout, self.copies, self.newest = layout, [], None
        snap = next((s for s in self.copies if s is not self.newest and not s.in_flight), None)
        if snap is None:
            snap = Snapshot(layout)
            self.allocated += 1
            self.copies.append(snap)
            if len(self.copies) > self.keep:
                oldest = next(s for s in self.copies if s is not self.newest and s is not snap)
                self.copies.remove(oldest)
                if not self.dropped:
                    log.warning("weight snapshots: %d copies still being sent (a slow subscriber?); the "
                                "oldest leaves the pool and ZeroMQ frees it once sent", self.keep)
                self.dropped += 1
        with torch.no_grad():  # one call for all tensors: per-tensor copies cost more in Python than in bytes
            torch._foreach_copy_(snap.tensors, [t.detach() for t in state.values()])
        self.newest = snap
        return snap
