"""The copy environment's Action and Observation, as OpenEnv's models.py declares them."""

from openenv.core.env_server.types import Action, Observation
from pydantic import Field


class CopyAction(Action):
    """What the agent writes: some symbols."""

    message: str = Field(..., description="The symbols written back")


class CopyObservation(Observation):
    """What the environment says next ("next" between turns; empty when done)."""

    message: str = Field(default="", description="The environment's next message")
