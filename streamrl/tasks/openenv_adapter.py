"""OpenEnv environments, unchanged: `task.name: openenv` (docs/guides/openenv.md).

The environment runs behind an OpenEnv server: a running one (`task.env_url`), or one each actor serves itself with
uvicorn on a loopback port of its own (`task.env_app`): the app of OpenEnv's `create_app(Env, Action, Observation,
...)`, or the `Environment[Action, Observation, State]` class, for which the actor makes that app. Each episode
talks to it through OpenEnv's own client (`task.environment`, an `EnvClient` subclass as "module:Client" /
"file.py:Client"; null: `GenericEnvClient`), one WebSocket session per episode in flight, so the server's
`max_concurrent_envs` must cover the actor's episodes (`actors.prompts_per_generate` x `actors.group_size`); a
session refused is an environment failure. A session whose episode ended with `done` is reset again by a later
episode (OpenEnv's Gym-style use of a client), saving a connection per episode; one that failed or was cut short is
closed.

An episode: `reset(**columns)` with the row's columns (the server hands the env's `reset` those it accepts: its
seed, its episode_id, its own keyword arguments); the opening messages are the row's prompt followed by the reset
observation's text (its `task.env_observation_field`) as a user message when it has any. Each model reply becomes
an Action with the reply in `task.env_action_field` (the client's Action class, read from its `EnvClient[Action,
Observation, State]` parameters; a dict for GenericEnvClient) and goes to `step`; the observation's text is
appended as the next user message, until the result says `done`. The episode's reward is the sum of its steps'
rewards (an earlier step's None adds nothing; None on the last step: the episode could not be scored), mapped onto
`task.reward_levels` by `streamrl.tasks.adapted`. A server error, a timeout (`task.tool_timeout_s` per message), or
a reward that is not a finite number or is on no level ends the episode as an environment failure.

Not kept: rubrics' per-component scores (only the observation's reward is read), MCP tool mode ("production"
clients), container/hub providers (`from_docker_image`, `from_env`: start the server yourself and give
`task.env_url`).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import typing
import warnings

from streamrl.tasks import plugins
from streamrl.tasks.adapted import AdaptedTask, add_reward, opening, to_level
from streamrl.tasks.environments import EnvironmentDefaults


class OpenEnvTask(AdaptedTask):
    """Rows from `task.data`; episodes of an OpenEnv environment through its client."""

    adapter = "openenv"

    def environment_class(self) -> type:
        return environment_class(self.cfg)


def _openenv_core():
    try:
        import openenv.core
    except ImportError as e:
        raise ValueError("task.name=openenv needs the openenv-core package: pip install 'streamrl[openenv]'") from e
    return openenv.core


class _Loop:
    """One event loop thread per process for every episode's async client (not a thread per client)."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def run(cls, coro, timeout: float):
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="openenv-clients", daemon=True).start()
                cls._loop = loop
        return asyncio.run_coroutine_threadsafe(coro, cls._loop).result(timeout)


def serve(app, host: str = "127.0.0.1") -> tuple[str, object]:
    """Serve an ASGI app (OpenEnv's create_app) with uvicorn on a free loopback port, in a daemon thread;
    (its base URL, the uvicorn Server: `server.should_exit = True` stops it)."""
    import time

    import uvicorn

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    config = uvicorn.Config(app, log_level="warning", ws="websockets")  # "auto" logs a traceback per closed session
    with warnings.catch_warnings():  # uvicorn deprecates this implementation, still its sound one for OpenEnv's
        warnings.simplefilter("ignore")
        config.load()
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="openenv-server", daemon=True).start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the OpenEnv app did not start serving on {host} in 30 s")
        time.sleep(0.02)
    return f"http://{host}:{sock.getsockname()[1]}", server


def _type_params(cls: type) -> tuple:
    """The type arguments of the first parametrised base of `cls` (`EnvClient[A, O, S]`: (A, O, S)); () if none."""
    for klass in cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            args = typing.get_args(base)
            if args and isinstance(args[0], type):
                return args
    return ()


def action_class(client_cls: type):
    """The Action type of an `EnvClient[Action, Observation, State]` subclass; dict when it has none."""
    return (_type_params(client_cls) or (dict,))[0]


def app_of(env_cls: type, sessions: int = 256):
    """OpenEnv's own app (`create_app`) for an `Environment[Action, Observation, State]` subclass, taking up to
    `sessions` WebSocket sessions at once (the class must say SUPPORTS_CONCURRENT_SESSIONS)."""
    from openenv.core.env_server.http_server import create_app

    params = _type_params(env_cls)
    if len(params) < 2:
        raise ValueError(f"task.env_app: {env_cls.__name__} does not declare its types: subclass "
                         "Environment[Action, Observation, State], or give the app create_app made")
    return create_app(env_cls, params[0], params[1], env_name=env_cls.__name__, max_concurrent_envs=sessions)


def field_of(observation, name: str | None, where: str) -> str:
    """The text of an observation's field ("" for no field name, or None); ValueError naming what it has."""
    if not name:
        return ""
    if isinstance(observation, dict):
        if name not in observation:
            raise ValueError(f"{where}: the observation has no field {name!r} (task.env_observation_field); it "
                             f"has {sorted(observation)}")
        value = observation[name]
    else:
        if not hasattr(observation, name):
            fields = sorted(getattr(type(observation), "model_fields", {}) or vars(observation))
            raise ValueError(f"{where}: the observation has no field {name!r} (task.env_observation_field); it "
                             f"has {fields}")
        value = getattr(observation, name)
    return "" if value is None else str(value)


class OpenEnvEnvironment(EnvironmentDefaults):
    """streamrl's `Environment` over one OpenEnv session: one instance per episode (see the module docstring)."""

    client_cls: type = dict
    url: str = ""
    action_field: str = "message"
    observation_field: str | None = "message"
    timeout_s: float = 30.0
    levels: list[float] = []
    tolerance: float = 0.01

    idle: list = []
    """Sessions whose episode ended well, for the next episode's reset (a new class's own list)."""

    def __init__(self, row: dict):
        self.row = row
        try:  # a session outlives its episode, as a Gym-style client is reset again: no handshake per episode
            self.client, self.reused = self.idle.pop(), True
        except IndexError:
            self.client, self.reused = self.client_cls(base_url=self.url, message_timeout_s=self.timeout_s), False
        self.total, self.turns, self.closed, self.ok = None, 0, False, False

    def _run(self, coro):
        return _Loop.run(coro, self.timeout_s + 5)

    def reset(self) -> list[dict]:
        kwargs = {k: v for k, v in self.row.items() if k not in ("prompt", "id")}
        try:
            result = self._run(self.client.reset(**kwargs))
        except Exception:
            if not self.reused:
                raise
            # A kept session the server has since closed (its idle timeout): a new one, once.
            self._run(self.client.close())
            self.client, self.reused = self.client_cls(base_url=self.url, message_timeout_s=self.timeout_s), False
            result = self._run(self.client.reset(**kwargs))
        text = field_of(result.observation, self.observation_field, f"{self.client_cls.__name__}.reset")
        return opening(self.row) + ([{"role": "user", "content": text}] if text else [])

    def step(self, reply: str) -> tuple[list[dict], float | None, bool]:
        self.turns += 1
        where = f"{self.client_cls.__name__}.step (turn {self.turns})"
        cls = action_class(self.client_cls)
        action = {self.action_field: reply} if cls is dict or typing.get_origin(cls) is dict else cls(
            **{self.action_field: reply})
        result = self._run(self.client.step(action))
        self.total = add_reward(self.total, result.reward, where)
        if result.done:
            # a bad reward fails the episode; None on the last step: it could not be scored (reward_health.NONE_RULE)
            level = None if result.reward is None else to_level(self.total, self.levels, self.tolerance, where)
            self.ok = True
            self.close()
            return [], level, True
        text = field_of(result.observation, self.observation_field, where)
        return ([{"role": "user", "content": text}] if text else []), None, False

    def close(self) -> None:
        """A session whose episode ended with done goes back for reuse; any other (an error, a truncation) closes."""
        if not self.closed:
            self.closed = True
            if self.ok:
                self.idle.append(self.client)
            else:
                self._run(self.client.close())


_served: dict[str, str] = {}  # env_app ref → the URL this process serves it on


def environment_class(task) -> type:
    """The `Environment` class episodes of `task` (a TaskConfig) are built with; serves task.env_app once per
    process, and checks the client class."""
    core = _openenv_core()
    if task.environment:
        client_cls = plugins.resolve(task.environment, "task.environment", "Client")
        if not (isinstance(client_cls, type) and issubclass(client_cls, core.EnvClient)):
            raise ValueError(f"task.environment={task.environment!r}: names {client_cls!r}, not an OpenEnv "
                             "EnvClient subclass (or leave it null for GenericEnvClient)")
    else:
        client_cls = core.GenericEnvClient
    url = task.env_url
    if task.env_app:
        if task.env_app not in _served:
            app = plugins.resolve(task.env_app, "task.env_app", "app")
            if isinstance(app, type) and issubclass(app, core.Environment):  # the environment class itself
                app = app_of(app)
            _served[task.env_app] = serve(app)[0]
        url = _served[task.env_app]
    return type(f"OpenEnv[{client_cls.__name__}]", (OpenEnvEnvironment,), {
        "client_cls": client_cls, "url": url, "action_field": task.env_action_field,
        "observation_field": task.env_observation_field or None, "timeout_s": task.tool_timeout_s,
        "levels": sorted(task.reward_levels), "tolerance": task.reward_level_tolerance, "idle": []})
