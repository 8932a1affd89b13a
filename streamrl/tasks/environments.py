"""Multi-turn environments: the plug-in interface (`Environment`, and `EnvironmentDefaults` for its optional
member), how one is found (`task.environment`), and its tools' schemas.

An environment plays one episode per data row, turn by turn (the `Environment` protocol below):

    class MyEnv:                                    # may inherit EnvironmentDefaults (tools = [])
        tools: list[Callable] = []                  # typed functions with docstrings, optional
        def __init__(self, row: dict): ...        # or (self, row, options) with `Options` declared
        def reset(self) -> list[dict]: ...          # the opening chat messages
        def step(self, reply: str) -> tuple[list[dict], float | None, bool]:
            ...                                     # (messages to append, reward when done, done)

The actor's episode runner (`streamrl.actors.environment_episodes`) renders the conversation (tools through the
chat template's `tools=`), samples the model's reply, and then: a reply that calls tools has them run (with a
timeout, on a thread pool) and each result appended as a `tool` message, and the model goes on; a reply with no
tool call goes to `step`, whose messages are appended, until it says done or the episode hits `task.max_turns`
or `model.max_seq_len` (truncated: counted, and scored with the task's lowest reward level where `step` gave
none). `row` is the task's prompt: its other columns, with "prompt" (its text or chat messages) and "id". Tools
may be bound methods, so they can see the row. A class that declares `Options` (a streamrl.registry.Options Struct:
the keys it adds to the `task` section) is built as `Cls(row, options)`, with them parsed from the run's config.

`task.environment` names the class as "package.module:Class", "path/to/file.py:Class", or an entry point of
the group `streamrl.environments` (a package's `[project.entry-points."streamrl.environments"]`).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Protocol, runtime_checkable

from streamrl.config import TaskConfig
from streamrl.tasks import plugins
from streamrl.registry import ENVIRONMENTS
from streamrl.tasks.base import TASKS, optional
from streamrl.tasks.data_errors import WatchedRow

GROUP = "streamrl.environments"


@runtime_checkable
class Environment(Protocol):
    """What an environment must have; it is built as `Cls(row)` for each episode (see the module docstring).
    Its one optional member, `tools`, defaults to none (`EnvironmentDefaults`, `tools_of`)."""

    def reset(self) -> list[dict]:
        """The episode's opening chat messages ({"role", "content"})."""

    def step(self, reply: str) -> tuple[list[dict], float | None, bool]:
        """After a model reply without a tool call: (messages to append, the reward when done, done)."""


class EnvironmentDefaults:
    """The optional member of an environment and its default; streamrl's own inherit this, a plug-in may."""

    tools: list[Callable] = []
    """Functions the model may call (typed, with docstrings: their schemas reach the chat template); may be
    bound methods, set in __init__, so they see the row."""


def load(ref: str) -> type:
    """The environment class `ref` names; one missing reset or step is an error naming what is missing."""
    cls = plugins.resolve(ref, "task.environment", "Class", group=GROUP)
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if not isinstance(cls, type) or missing:
        raise ValueError(f"task.environment={ref!r}: not an environment class (it needs reset() and step(reply); "
                         f"missing {', '.join(missing) or 'a class'})")
    return cls


KINDS = ("single_turn", "environment_episodes", "agent_episodes")
"""How a task's samples are made: one completion each, an environment's episodes, an agent's episodes."""


def class_of(task, task_cfg: TaskConfig) -> type:
    """The environment class of a task whose rollout is "environment_episodes": its own (an adapter's), else
    task.environment's."""
    return optional(task, "environment_class")() or load(task_cfg.environment)


def options_of(env_cls: type, task_cfg: TaskConfig) -> tuple:
    """What an episode's environment is built with besides its row: `(options,)` for a class that declares its
    `Options` (parsed from the task section's keys), else nothing: `env_cls(row, *options_of(env_cls, task_cfg))`."""
    if getattr(env_cls, "Options", None) is None:
        return ()
    return (task_cfg.options_as(ENVIRONMENTS, env_cls.Options),)


def row_of(prompt) -> WatchedRow:
    """The row an environment or agent is given: a task Prompt's columns, its "prompt" (messages or text) and
    "id", watched for the keys read from it that it lacks (streamrl.tasks.data_errors)."""
    return WatchedRow({**prompt.columns, "prompt": list(prompt.messages) if prompt.messages else prompt.text,
                       "id": prompt.id}, getattr(prompt, "where", "") or f"row {prompt.id}")


def tools_of(env) -> dict[str, Callable]:
    """name → callable of an environment's tools (its `tools` attribute; none when absent: the default of
    `EnvironmentDefaults`, for a plug-in that does not inherit it). Read once per episode, when it is built."""
    tools = list(getattr(env, "tools", None) or [])
    out: dict[str, Callable] = {}
    for fn in tools:
        name = getattr(fn, "__name__", None)
        if not callable(fn) or not name:
            raise ValueError(f"{type(env).__name__}.tools: {fn!r} is not a named function")
        if name in out:
            raise ValueError(f"{type(env).__name__}.tools: two tools are named {name!r}")
        out[name] = fn
    return out


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def schema(fn: Callable) -> dict:
    """The tool's JSON schema as chat templates take it (`tools=`): transformers' `get_json_schema` where the
    docstring documents every argument, else one built from the signature (the docstring's first line as its
    description)."""
    try:
        from transformers.utils import get_json_schema

        return get_json_schema(fn)
    except Exception:  # no transformers, or a docstring without an Args section
        pass
    hints = {}
    try:
        import typing

        hints = typing.get_type_hints(fn)
    except Exception:
        pass
    params = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
    props: dict[str, Any] = {p.name: {"type": _JSON_TYPES.get(hints.get(p.name), "string")} for p in params}
    required = [p.name for p in params if p.default is inspect.Parameter.empty]
    doc = (inspect.getdoc(fn) or "").strip().splitlines()
    return {"type": "function", "function": {"name": fn.__name__, "description": doc[0] if doc else "",
                                             "parameters": {"type": "object", "properties": props,
                                                            "required": required}}}
