"""What an agent's episode returned, as the agent runner (`streamrl.actors.agents`) scores it: its return as one
number (`reward_of`; the runner then puts it on the task's levels), or the failure reason, and what the user needs to
see of a failure (`detail`: the agent's own traceback, or what it returned and what is allowed)."""

from __future__ import annotations

import math

from streamrl.tasks.reward_health import NONE_RULE
from streamrl.tasks.user_frames import user_traceback


def reward_of(value) -> tuple[float | None, str | None]:
    """An agent's return as one number (a dict's values summed, its Nones skipped), or the failure reason: `none`
    for None, or a dict of nothing but Nones (reward_health.NONE_RULE)."""
    if isinstance(value, dict):
        given = [v for v in value.values() if v is not None]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in given):
            return None, "bad_return"
        value = sum(given) if given else None
    if value is None:
        return None, "none"
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None, "bad_return"
    return (float(value), None) if math.isfinite(value) else (None, "non_finite")


def detail(e, why: str, levels: list[float], timeout_s: float) -> str:
    """What the user needs to see of episode `e`'s failure `why`: the agent's own traceback, or what went wrong."""
    if e.error is not None and e.failure is None:  # its own exception: from the agent's frame down
        return user_traceback(e.error)
    if why == "timeout":
        return f"episode {e.id} ran past task.agent_timeout_s={timeout_s:g}s (abandoned)"
    if why == "no_model_call":
        return f"episode {e.id}: the agent returned {e.value!r} without calling the model"
    if why == "none":
        return f"episode {e.id}: the agent returned {e.value!r} ({NONE_RULE})"
    return f"episode {e.id}: the agent returned {e.value!r} ({why}); allowed: a number on {levels} or a dict"
