"""The collective weight sync's actor end when the engine's own workers are the group's ranks (vLLM): each worker
joins the learner's group and loads every version it receives in place, so nothing passes through the actor process.
The learner's end (`collective.LearnerSync`) is the same; it counts one rank per engine worker."""

from __future__ import annotations

import logging
import time
from typing import Callable

import torch

from streamrl.comm.sync_messages import mismatch
from streamrl.comm.weights.collective import SyncRecord, WeightSyncError
from streamrl.comm.wire import TensorInfo, WeightsCollective

log = logging.getLogger(__name__)


class InEngine(dict):
    """The tensors `EngineSync.receive` hands on: none, since the engine's workers loaded the version themselves (the
    backend's `load_weights` has nothing left to do for it)."""


class EngineSync(SyncRecord):
    """An actor's end when its engine's workers join the group themselves (vLLM: each worker is a rank and loads what
    it receives in place, nothing passing through the actor process). The same face as ActorSync.

    `join(first_rank, world)` and `take(buckets)` are the backend's: joining blocks until the group forms (the actor
    starts after its engine; the learner waits for the group at its first publish), and a worker's rank is
    first_rank + its tensor-parallel rank."""

    def __init__(self, join: Callable[[int, int], None], take: Callable[[list], None], index: int, actors: int,
                 engine_workers: int, expected: dict[str, torch.Tensor]):
        super().__init__()
        self.take = take
        self.expected = {name: TensorInfo.of(name, t.dtype, t.shape) for name, t in expected.items()}
        first, world = 1 + index * engine_workers, 1 + actors * engine_workers
        try:
            join(first, world)
            log.info("weight sync: the engine's %d worker(s) joined the group as ranks %d-%d of %d", engine_workers,
                     first, first + engine_workers - 1, world)
        except Exception as e:  # noqa: BLE001  (a worker's failure comes back as the engine's error: stay on ZeroMQ)
            self.fail(f"the engine's workers could not join the group: {e}")

    @property
    def ready(self) -> bool:
        return self.failed is None

    def receive(self, msg: WeightsCollective) -> dict[str, torch.Tensor] | None:
        if not self.ready:
            return None
        if why := mismatch(msg, self.expected):
            self.fail(why)
            return None

        def take() -> dict:
            t0 = time.perf_counter()
            try:
                self.take(msg.buckets)
            except Exception as e:  # noqa: BLE001  (a timeout or bad checksum in a worker: nothing was loaded)
                raise WeightSyncError(f"version {msg.version}: {e}") from None
            return {"sync_s": time.perf_counter() - t0}

        return InEngine() if self._count(take) else None

    def close(self) -> None:
        """The workers' group ends with the engine."""
