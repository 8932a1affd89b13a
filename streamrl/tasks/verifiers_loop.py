"""What the agents of verifiers' two stacks share (`Rollouts`, classic; `Episodes`, v1): verifiers is asyncio, the
actor's episode runner calls an agent from its threads, so each agent runs its episodes on one event loop in a
thread of its own, started with the first episode; and it counts the episodes verifiers ended errored but scored,
which the runner takes as truncations. An agent returns the rubric's reward as verifiers gives it: the runtime puts
it on the task's levels by its one rule (`streamrl.actors.episodes`)."""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Callable, Coroutine


class LoopAgent:
    """The event loop and the error counts of a verifiers agent; `kind` names it in the actor's failure reports."""

    kind = "verifiers environment"

    def __init__(self, name: str):
        self.__name__ = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._errors: collections.Counter = collections.Counter()

    def _start(self, setup: Callable[[asyncio.AbstractEventLoop], None] = lambda loop: None) -> None:
        """The loop, started once (with `setup(loop)`, under the lock, before any episode may use either)."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="verifiers-loop", daemon=True).start()
                setup(loop)
                self._loop = loop

    def _run(self, coro: Coroutine, timeout: float | None = None):
        """`coro`'s result, run on the loop (from the runner's thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _count_error(self, name: str) -> None:
        with self._lock:
            self._errors[name] += 1

    def take_errors(self) -> dict[str, int]:
        """Episodes verifiers ended errored but scored, since the last take, by error (counted as truncated)."""
        with self._lock:
            out, self._errors = dict(self._errors), collections.Counter()
        return out

    def close(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
