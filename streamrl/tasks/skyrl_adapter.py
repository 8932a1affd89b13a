"""SkyRL-Gym environments, unchanged: `task.name: skyrl_gym` (docs/guides/skyrl-gym.md).

`task.environment` is an env id registered with `skyrl_gym.register` (made with `skyrl_gym.make`; written
"module:env_id" or "file.py:env_id", the module that registers it is imported first), or the `BaseTextEnv` subclass itself as "package.module:Class" /
"path/file.py:Class"; a row's `env_class` column overrides it for that row, as in SkyRL's datasets. Each episode
is one env, built as SkyRL's generator builds it: `make(id, env_config=task.env_config, extras=row)`, where the
extras are the row's columns but its prompt (and streamrl's "id", and `env_class`), with `max_turns` set to
`task.max_turns`. Then SkyRL's loop: `init(prompt)` gives the opening messages, each model reply (the text,
tool-call markup and all: a SkyRL env parses its own tools) goes to `step(action)`, whose
`BaseTextEnvStepOutput` observations are appended until `done`; `close()` ends it. The episode's reward is
the sum of its steps' rewards (what SkyRL's outcome estimators sum its token-level rewards to; an earlier step's
None adds nothing, and a None on the last step means the env could not score the episode), mapped onto
`task.reward_levels` by `streamrl.tasks.adapted`. A step that raises, returns no `BaseTextEnvStepOutput`, or a
reward that is not a finite number or is on no level, ends the episode as an environment failure.

Not kept: `postprocessed_action` (streamrl trains on the tokens sampled, never on re-tokenised text: a step
that returns one is counted in the log, once, and ignored), `get_metrics`, and SkyRL's async `step`.
"""

from __future__ import annotations

import functools
import logging

from streamrl.tasks import plugins
from streamrl.tasks.data_errors import WatchedRow
from streamrl.tasks.adapted import AdaptedTask, add_reward, opening, to_level
from streamrl.tasks.environments import EnvironmentDefaults

log = logging.getLogger("streamrl.actor")
_NOT_EXTRAS = ("prompt", "id", "env_class")


class SkyRLGymTask(AdaptedTask):
    """Rows from `task.data` (SkyRL's dataset rows: "prompt" and the env's extras); episodes of a SkyRL-Gym env."""

    adapter = "skyrl_gym"

    def environment_class(self) -> type:
        return environment_class(self.cfg)


def _skyrl_gym():
    try:
        import skyrl_gym
    except ImportError as e:
        raise ValueError("task.name=skyrl_gym needs the skyrl-gym package: pip install 'streamrl[skyrl-gym]'") from e
    return skyrl_gym


def _check_ref(ref: str) -> None:
    """ValueError when `ref` names neither a registered env id nor a BaseTextEnv class (said at the actor's start)."""
    skyrl_gym = _skyrl_gym()
    cls, env_id = resolve(ref)
    if cls is not None:
        return
    try:
        skyrl_gym.spec(env_id)
    except Exception as e:
        ids = ", ".join(sorted(skyrl_gym.registry))
        raise ValueError(f"task.environment={ref!r}: no SkyRL-Gym env by that id ({type(e).__name__}: {e}); "
                         f"registered: {ids}; or give 'package.module:Class' / 'file.py:Class'") from e


@functools.lru_cache(maxsize=None)
def resolve(ref: str) -> tuple[type | None, str]:
    """(the skyrl_gym.Env subclass, "") that "module:Class" / "file.py:Class" names, or (None, the env id) for an
    id: a plain one, or "module:env_id" / "file.py:env_id", whose module is imported first (SkyRL registers an
    env when the module that calls skyrl_gym.register is imported, which skyrl_gym.make does not do itself)."""
    if ":" not in ref:
        return None, ref
    name = ref.rpartition(":")[2]
    try:
        found = plugins.resolve(ref, "task.environment", "Class")
    except ValueError as e:
        if name in _skyrl_gym().registry:  # the module's import registered it
            return None, name
        raise ValueError(f"{e}; nor is {name!r} a registered SkyRL-Gym env id") from e
    if not (isinstance(found, type) and issubclass(found, _skyrl_gym().Env)):
        raise ValueError(f"task.environment={ref!r}: names {found!r}, not a skyrl_gym.Env (BaseTextEnv) subclass")
    return found, ""


def make(ref: str, env_config: dict, extras: dict):
    """A new env, as SkyRL's generator makes one."""
    skyrl_gym = _skyrl_gym()
    try:
        from omegaconf import OmegaConf

        config = OmegaConf.create(dict(env_config))  # what SkyRL hands an env (attribute and key access)
    except ImportError:
        config = dict(env_config)
    cls, env_id = resolve(ref)
    return cls(env_config=config, extras=extras) if cls is not None else skyrl_gym.make(
        env_id, env_config=config, extras=extras)


class SkyRLGymEnvironment(EnvironmentDefaults):
    """streamrl's `Environment` over one SkyRL-Gym env: one instance per episode (see the module docstring)."""

    ref: str = ""
    env_config: dict = {}
    max_turns: int = 1
    levels: list[float] = []
    tolerance: float = 0.01
    _warned_postprocessed = False

    def __init__(self, row: dict):
        self.row = row
        extras = {k: v for k, v in row.items() if k not in _NOT_EXTRAS}
        if isinstance(row, WatchedRow):  # the env reads its row as extras: a key it lacks is the row's fault
            extras = row.derived(extras)
        extras["max_turns"] = self.max_turns
        self.name = row.get("env_class") or self.ref
        self.env = make(self.name, self.env_config, extras)
        self.total, self.turns, self.closed = None, 0, False

    def reset(self) -> list[dict]:
        got = self.env.init(opening(self.row))
        if not (isinstance(got, tuple) and len(got) == 2):
            raise TypeError(f"{self.name}: init(prompt) returned {type(got).__name__}, not (messages, metadata)")
        return _messages(got[0], f"{self.name}.init")

    def step(self, reply: str) -> tuple[list[dict], float | None, bool]:
        self.turns += 1
        where = f"{self.name}.step (turn {self.turns})"
        out = self.env.step(reply)
        if not isinstance(out, dict) or "done" not in out:
            raise TypeError(f"{where}: returned {type(out).__name__}, not a BaseTextEnvStepOutput "
                            "(observations, reward, done, metadata)")
        self.total = add_reward(self.total, out.get("reward"), where)
        if out.get("postprocessed_action") is not None and not SkyRLGymEnvironment._warned_postprocessed:
            SkyRLGymEnvironment._warned_postprocessed = True
            log.warning("%s: postprocessed_action is ignored: streamrl trains on the tokens sampled", where)
        if out["done"]:
            self.close()
            # None on the last step: the env could not score the episode, whatever earlier steps gave (NONE_RULE)
            return [], None if out.get("reward") is None else to_level(self.total, self.levels, self.tolerance,
                                                                        where), True
        return _messages(out.get("observations") or [], where), None, False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.env.close()


def _messages(value, where: str) -> list[dict]:
    if not isinstance(value, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value):
        raise TypeError(f"{where}: observations must be a list of {{'role': str, 'content': str}} messages, "
                        f"got {value!r:.120}")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def environment_class(task) -> type:
    """The `Environment` class episodes of `task` (a TaskConfig) are built with; checks the env exists."""
    if not task.environment:
        raise ValueError("task.name=skyrl_gym needs task.environment: a registered env id, or "
                         "'package.module:Class' / 'file.py:Class' (a BaseTextEnv subclass)")
    _check_ref(task.environment)
    return type(f"SkyRLGym[{task.environment}]", (SkyRLGymEnvironment,), {
        "ref": task.environment, "env_config": dict(task.env_config), "max_turns": task.max_turns,
        "levels": sorted(task.reward_levels), "tolerance": task.reward_level_tolerance})
