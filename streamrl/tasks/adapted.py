"""What the ecosystem adapters share (`task.name: skyrl_gym`, `task.name: openenv`): a data-row task whose
episodes are played by another ecosystem's environment through streamrl's own `Environment` protocol, and the
map from that environment's return onto the task's ordinal levels.

An adapted environment plays its episode through `streamrl.actors.environment_episodes` like any `task.environment`,
so it keeps token-in-token-out turns, the environment-token mask and every backend (hf, vLLM); the adapter only
translates the calls. Its return (the sum of the rewards of its steps, as SkyRL's outcome estimators and OpenEnv's
episode return add them; an earlier step's None adds nothing, and a None on the last step means the episode could
not be scored) is mapped onto `task.reward_levels` by the episode runtime's one rule (`streamrl.actors.episodes`): the level within `task.reward_level_tolerance` of it; with `reward.bucket_edges`
instead of levels, the return as it is (the buckets shape it). A return that is not a finite number, or is on no
level, raises (`BadReward`): the episode counts as an environment failure (`episodes_step_raised`) and ends
unscored, never silently rounded.
"""

from __future__ import annotations

import math

from streamrl.config import TaskConfig
from streamrl.tasks.base import Prompt
from streamrl.tasks.dataset import DatasetTask
from streamrl.tasks.rewards import nearest_level


class BadReward(ValueError):
    """An environment's reward that is not a finite number or is on none of the task's levels."""


def add_reward(total: float | None, value, where: str) -> float | None:
    """The episode's return so far with a step's reward added. A step's None gives nothing (TRL's rule: skipped;
    the adapters read a None on the last step as "could not score the episode": reward_health.NONE_RULE). BadReward
    for anything else that is not a finite number."""
    if value is None:
        return total
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise BadReward(f"{where}: reward {value!r} is not a finite number")
    return (total or 0.0) + float(value)


def to_level(total: float | None, levels: list[float], tolerance: float, where: str) -> float | None:
    """The level of `levels` within `tolerance` of `total` ([] levels: `total` unchanged, for bucketing; None: the
    episode could not be scored, left for the runtime to count)."""
    if not levels or total is None:
        return total
    near = nearest_level(total, levels, tolerance)
    if near is None:
        raise BadReward(f"{where}: the episode's reward {total:g} is on none of task.reward_levels {levels} "
                        f"(tolerance {tolerance:g}); declare its levels, or bucket it with reward.bucket_edges")
    return near


class AdaptedTask(DatasetTask):
    """Rows from `task.data`; each sample is an episode of the adapted environment, which gives its reward."""

    grouped = False  # scored by its episodes (streamrl.actors.environment_episodes), never by reward functions
    adapter = "adapted"

    def __init__(self, cfg: TaskConfig):
        self._rows(cfg, f"task {self.adapter}")
        self.functions = None

    def close(self) -> None:
        pass  # no reward functions: the environments belong to the actor's episode runner

    def score(self, prompt: Prompt, completion: str) -> float:
        raise ValueError(f"task {self.adapter}: a sample is scored by its environment's episode; single-completion "
                         "scoring (eval.every, streamrl eval) is not supported for it yet")


def opening(row: dict) -> list[dict]:
    """The row's prompt as chat messages (a text prompt becomes one user message)."""
    prompt = row["prompt"]
    return [dict(m) for m in prompt] if isinstance(prompt, (list, tuple)) else [{"role": "user", "content": prompt}]
