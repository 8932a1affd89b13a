"""A CUDA IPC handle provider for CPU tests (streamrl.comm.weights.ipc.Provider): the learner and actor share one
process, so a handle is a key into this provider's table of live buffers. Released buffers leave the table, so an
actor opening a freed version fails as it would on a GPU, and `open_error` makes every open fail (another node,
no CUDA, a peer-access failure)."""

from __future__ import annotations

import itertools

import torch


class SameProcess:
    name = "same-process"

    def __init__(self, open_error: Exception | None = None):
        self.live: dict[int, torch.Tensor] = {}
        self.opened: list[int] = []
        self.open_error = open_error
        self._keys = itertools.count()

    def export(self, flat: torch.Tensor) -> list:
        key = next(self._keys)
        self.live[key] = flat
        return [key]

    def open(self, handle: list, device: torch.device) -> torch.Tensor:
        if self.open_error is not None:
            raise self.open_error
        self.opened.append(handle[0])
        return self.live[handle[0]].to(device)

    def release(self, flat: torch.Tensor) -> None:
        for key in [k for k, t in self.live.items() if t is flat]:
            del self.live[key]

    @property
    def held(self) -> int:
        """Distinct buffers still exported."""
        return len({id(t) for t in self.live.values()})
