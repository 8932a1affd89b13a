"""`streamrl bench agents`: a two-turn agent episode against the same task as an environment episode.

The task is the copy-agent example's (examples/copy-agent, on the tiny model, hf backend, as an actor runs it):
write back four symbols over two model turns, the user saying "next" between them. As an agent (`copy_agent`
below: plain `openai` client code, two chat calls) through the actor's endpoint (`streamrl.actors.agents`), and as
an environment (`CopyEnv` below, the same turns) through `streamrl.actors.environment_episodes`: the same prompts,
the same G and the same `actors.prompts_per_generate`, one make_groups call each in turn so load on the machine falls
on both alike.

Shapes: the tiny model of the example (the issue's case, whose model turn costs well under a millisecond an
episode), the same with the agent written as a coroutine (`openai.AsyncOpenAI`), and a larger model writing 16 tokens
a turn (where the model's own time is larger).

Reported per episode: the wall time of each and their ratio (agent / environment), and where the agent's time went:
- generate_ms, generate_calls: the model's own generation and how many calls it took (env_*: the environment's; more
  and smaller batches cost more);
- window_ms: the runner waiting, after a first request, for other episodes' (`endpoint.batch_window_s`);
- idle_ms: the runner waiting for any request at all (the agents' own work between turns);
- serve_ms: rendering turns and building answers on the runner's thread, besides generation;
- client_setup_ms: the client handed to each episode (`AgentEpisodes._client_for`);
- request_ms: an agent's `create` call as the agent sees it; in_app_ms: the same request inside the endpoint's ASGI
  app (body, checks, queue, the batch's generation, answer); client_and_transport_ms: the difference, the openai
  client's work (building the request, serializing, parsing the reply into its models) and the transport's;
- agent_cpu_ms: the CPU the agent's own thread spent in its episode (almost all of it the openai client's work), and
  ratio_floor = (env_ms + agent_cpu_ms) / env_ms: the ratio if everything but the agent's own code were free (an
  async agent has no thread: its work is in endpoint_cpu_ms, the endpoint loop's CPU, and the floor uses that);
- endpoint_cpu_ms, runner_cpu_ms (env_runner_cpu_ms): the CPU of the endpoint's loop thread and of each runner's.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "copy-agent"
_timed = threading.local()


def copy_agent(client, row: dict) -> float:
    """The copy-agent example's agent, its `create` calls timed as the agent sees them, and its thread's CPU."""
    cpu = time.thread_time()
    messages = [{"role": "user", "content": row["prompt"]}]
    said = []
    for say in ("next", None):
        t0 = time.perf_counter()
        reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=2)
        _timed.requests.append(time.perf_counter() - t0)
        said.append(reply.choices[0].message.content)
        if say:
            messages += [{"role": "assistant", "content": said[-1]}, {"role": "user", "content": say}]
    _timed.cpu.append(time.thread_time() - cpu)
    words = said[0].split()[:2] + said[1].split()[:2]
    target = row["target"].split()
    return sum(a == b for a, b in zip(words, target)) / len(target)


async def copy_agent_async(client, row: dict) -> float:
    """The same agent on `openai.AsyncOpenAI`: a coroutine on the endpoint's loop (its CPU is the loop's)."""
    messages = [{"role": "user", "content": row["prompt"]}]
    said = []
    for say in ("next", None):
        t0 = time.perf_counter()
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=2)
        _timed.requests.append(time.perf_counter() - t0)
        said.append(reply.choices[0].message.content)
        if say:
            messages += [{"role": "assistant", "content": said[-1]}, {"role": "user", "content": say}]
    words = said[0].split()[:2] + said[1].split()[:2]
    target = row["target"].split()
    return sum(a == b for a, b in zip(words, target)) / len(target)


class CopyEnv:
    """The same two turns as an environment: the prompt, then "next", scored by the fraction right."""

    tools: list = []

    def __init__(self, row: dict):
        self.prompt, self.target, self.said = row["prompt"], row["target"].split(), []

    def reset(self) -> list[dict]:
        return [{"role": "user", "content": self.prompt}]

    def step(self, reply: str):
        self.said += reply.split()[:2]
        if len(self.said) < len(self.target) and len(self.said) <= 2:
            return [{"role": "user", "content": "next"}], None, False
        return [], sum(a == b for a, b in zip(self.said, self.target)) / len(self.target), True


class _Counting:
    """The backend, counting its generate calls and their seconds."""

    def __init__(self, backend):
        self.backend, self.seconds, self.calls = backend, 0.0, 0

    def generate(self, prompts, n, between_steps=None):
        t0 = time.perf_counter()
        try:
            return self.backend.generate(prompts, n)
        finally:
            self.seconds += time.perf_counter() - t0
            self.calls += 1


# (name, overrides): the task on the tiny model, and the same task on a larger model writing longer turns,
# where the model's own time per turn is larger and what an agent adds per request weighs less.
SHAPES = [("tiny", ()), ("tiny, async agent", (f"task.agent={__name__}:copy_agent_async",)),
          ("hidden 256 x 4 layers, 16 tokens a turn", (
    "model.hidden_size=256", "model.num_layers=4", "model.intermediate_size=512", "actors.max_new_tokens=16"))]


def agents(short: bool = False, overrides: tuple[str, ...] = ()) -> list[dict]:
    shapes = SHAPES[:1] if short else SHAPES
    return [_compare(name, (*shape, *overrides), 3 if short else 20) for name, shape in shapes]


def _compare(shape: str, overrides: tuple[str, ...], calls: int) -> dict:
    """One shape: `calls` make_groups calls of each kind, alternated, after one that warms both up."""
    import tempfile

    import torch

    from streamrl import config
    from streamrl.tasks import rewards

    common = [f"task.data={EXAMPLE / 'train.jsonl'}", f"run_dir={tempfile.mkdtemp(prefix='bench-agents-')}",
              *overrides]
    agent_cfg = config.load(str(EXAMPLE / "config.yaml"), [f"task.agent={__name__}:copy_agent", *common])
    env_cfg = config.load(str(EXAMPLE / "config.yaml"), [
        *common, "task.name=dataset", "task.agent=", f"task.environment={__name__}:CopyEnv", "task.max_turns=2"])
    torch.set_num_threads(agent_cfg.actors.threads or torch.get_num_threads())  # as an actor runs
    agent_runner, agent_backend, timing = _agent_runner(agent_cfg, rewards.build(agent_cfg))
    env_runner, env_backend = _env_runner(env_cfg, rewards.build(env_cfg))
    k = agent_cfg.actors.prompts_per_generate
    try:
        walls, cpu = _alternate({"agent": agent_runner, "env": env_runner}, k, calls,
                                lambda: timing.reset(agent_backend, env_backend))
    finally:
        agent_runner.close()
        env_runner.close()
    episodes = calls * k * agent_cfg.actors.group_size
    per = 1e3 / episodes
    agent_ms, env_ms = sum(walls["agent"]) * per, sum(walls["env"]) * per
    request_ms, in_app_ms = statistics.mean(timing.requests) * 1e3, statistics.mean(timing.in_app) * 1e3
    agent_cpu_ms = statistics.mean(timing.cpu) * 1e3 if timing.cpu else 0.0  # an async agent: none of its own
    floor_ms = agent_cpu_ms or sum(cpu["endpoint"]) * per  # an async agent's work is the endpoint loop's
    return {"bench": "agents", "shape": shape, "episodes": episodes, "turns": 2,
            "group_size": agent_cfg.actors.group_size, "agent_workers": agent_cfg.task.agent_workers,
            "agent_ms": agent_ms, "env_ms": env_ms, "ratio_agent_vs_env": agent_ms / env_ms,
            "generate_ms": agent_backend.seconds * per, "generate_calls": agent_backend.calls,
            "env_generate_ms": env_backend.seconds * per, "env_generate_calls": env_backend.calls,
            "window_ms": timing.window_s * per, "idle_ms": timing.idle_s * per,
            "serve_ms": (timing.serve_s - agent_backend.seconds) * per, "client_setup_ms": timing.client_s * per,
            "request_ms": request_ms, "in_app_ms": in_app_ms, "client_and_transport_ms": request_ms - in_app_ms,
            "agent_cpu_ms": agent_cpu_ms, "endpoint_cpu_ms": sum(cpu["endpoint"]) * per,
            "runner_cpu_ms": sum(cpu["agent"]) * per, "env_runner_cpu_ms": sum(cpu["env"]) * per,
            "ratio_floor": (env_ms + floor_ms) / env_ms}


def _alternate(runners: dict, k: int, calls: int, reset) -> tuple[dict, dict]:
    """Wall seconds of each runner's make_groups calls, alternated call by call after one that warms both up (the
    first generate, the client, the server), and the CPU seconds of each runner's thread and of the endpoint's."""
    import torch

    endpoint = time.pthread_getcpuclockid(runners["agent"].endpoint.thread.ident)
    rng = random.Random(0)
    walls, cpu = {"agent": [], "env": []}, {"agent": [], "env": [], "endpoint": []}
    for call in range(calls + 1):
        prompts = [runners["agent"].reward.task.sample(rng) for _ in range(k)]
        if call == 1:
            reset()
        for name in ("agent", "env")[::1 if call % 2 else -1]:
            torch.manual_seed(call)
            t0, c0, e0 = time.perf_counter(), time.thread_time(), time.clock_gettime(endpoint)
            runners[name].make_groups(prompts, 0)
            if call:
                walls[name].append(time.perf_counter() - t0)
                cpu[name].append(time.thread_time() - c0)
                served = getattr(runners[name], "endpoint", None) is not None  # the agent's: it has an endpoint
                cpu["endpoint"].append(time.clock_gettime(endpoint) - e0 if served else 0.0)
    return walls, cpu


class _Timing:
    """Where the agent runner's thread spends a call, and each request's time inside the endpoint's app."""

    def __init__(self):
        self.requests: list[float] = []
        self.cpu: list[float] = []
        self.in_app: list[float] = []
        self.window_s = self.idle_s = self.serve_s = self.client_s = 0.0

    def reset(self, *backends) -> None:
        self.requests.clear()
        self.cpu.clear()
        self.in_app.clear()
        self.window_s = self.idle_s = self.serve_s = self.client_s = 0.0
        for backend in backends:
            backend.seconds, backend.calls = 0.0, 0


def _agent_runner(cfg, reward):
    """The agent runner on a counted backend, its gather/serve/client set-up and its endpoint's app timed."""
    from streamrl.actors import backends
    from streamrl.actors.agents import AgentEpisodes
    from streamrl.models import model as model_lib

    model, tok = model_lib.build(cfg, reward.task.vocabulary)
    backend = _Counting(backends.build("hf", cfg, model, tok))
    runner = AgentEpisodes(cfg, 0, backend, tok, reward, "bench", backend.backend.eos_ids)
    timing = _Timing()
    _time_runner(runner, timing)
    fn = runner.fn

    def agent(client, row):  # on the episode's own thread
        _timed.requests, _timed.cpu = timing.requests, timing.cpu
        return fn(client, row)

    async def agent_async(client, row):  # on the endpoint's loop
        _timed.requests, _timed.cpu = timing.requests, timing.cpu
        return await fn(client, row)

    runner.fn = agent_async if runner.is_async else agent
    _time_app(runner.endpoint, timing.in_app)
    return runner, backend, timing


def _time_runner(runner, timing: _Timing) -> None:
    """The runner's waits for requests (idle, then the window), its serving and its clients' set-up, timed."""
    take, gather, serve, client_for = runner.endpoint.take, runner._gather, runner._serve, runner._client_for
    state = {"first": None}

    def timed_take(timeout_s):
        t0 = time.perf_counter()
        r = take(timeout_s)
        if state["first"] is None:  # waiting for a first request: idle; after it, the window
            timing.idle_s += time.perf_counter() - t0
            if r is not None:
                state["first"] = time.perf_counter()
        return r

    def timed_gather(running):
        state["first"] = None
        batch = gather(running)
        if state["first"] is not None:
            timing.window_s += time.perf_counter() - state["first"]
        return batch

    def timed_serve(batch, version, stats):
        t0 = time.perf_counter()
        serve(batch, version, stats)
        timing.serve_s += time.perf_counter() - t0

    def timed_client(episode_id):
        t0 = time.perf_counter()
        client = client_for(episode_id)
        timing.client_s += time.perf_counter() - t0
        return client

    runner.endpoint.take, runner._gather, runner._serve, runner._client_for = (
        timed_take, timed_gather, timed_serve, timed_client)


def _time_app(endpoint, into: list) -> None:
    """Each POST's seconds inside the endpoint's app: its route's handler, from the call to the response it returns."""
    from starlette.routing import request_response

    post = endpoint._post

    async def timed(request):
        t0 = time.perf_counter()
        try:
            return await post(request)
        finally:
            into.append(time.perf_counter() - t0)

    for route in endpoint.app.router.routes:
        if getattr(route, "endpoint", None) == post:
            route.endpoint = timed
            route.app = request_response(timed)


def _env_runner(cfg, reward):
    from streamrl.actors import backends
    from streamrl.actors.environment_episodes import EnvironmentEpisodes
    from streamrl.models import model as model_lib

    model, tok = model_lib.build(cfg, reward.task.vocabulary)
    backend = _Counting(backends.build("hf", cfg, model, tok))
    return EnvironmentEpisodes(cfg, backend, tok, reward, "bench", backend.backend.eos_ids), backend
