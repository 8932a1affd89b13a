"""The copy environment's client, as OpenEnv's client.py writes one: an EnvClient (one WebSocket session per
instance) that says how an Action goes on the wire and how a result comes back."""

from typing import Dict

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.types import State

from copy_models import CopyAction, CopyObservation


class CopyEnvClient(EnvClient[CopyAction, CopyObservation, State]):
    def _step_payload(self, action: CopyAction) -> Dict:
        return {"message": action.message}

    def _parse_result(self, payload: Dict) -> StepResult[CopyObservation]:
        obs = payload.get("observation", {})
        observation = CopyObservation(message=obs.get("message", ""), done=payload.get("done", False),
                                      reward=payload.get("reward"))
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: Dict) -> State:
        return State(episode_id=payload.get("episode_id"), step_count=payload.get("step_count", 0))
