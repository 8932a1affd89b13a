"""The copy task as an OpenEnv Environment (server side), in OpenEnv's own terms: `reset(seed, episode_id,
**kwargs)` takes the symbols to copy as `target`, each `step(CopyAction)` takes the next half of them and
returns a CopyObservation with `reward` and `done`. Two turns: the first half, then, after "next", the rest;
the reward, on the last step, is the fraction right. Nothing here knows streamrl."""

from typing import Any, Optional
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

from copy_models import CopyAction, CopyObservation


class CopyEnvironment(Environment[CopyAction, CopyObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True  # each WebSocket session gets its own instance

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.target: list[str] = []
        self.said: list[str] = []

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, target: str = "",
              **kwargs: Any) -> CopyObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.target, self.said = target.split(), []
        return CopyObservation(message="", done=False, reward=None)

    def step(self, action: CopyAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CopyObservation:
        self._state.step_count += 1
        half = -(-len(self.target) // 2)
        self.said += action.message.split()[:half]
        if self._state.step_count < 2:
            return CopyObservation(message="next", done=False, reward=0.0)
        right = sum(a == b for a, b in zip(self.said, self.target))
        return CopyObservation(message="", done=True, reward=right / max(1, len(self.target)))

    @property
    def state(self) -> State:
        return self._state
