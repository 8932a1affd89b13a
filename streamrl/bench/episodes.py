"""`streamrl bench episodes`: multi-turn generation with a slow tool against single-turn generation.

On the tiny model (the tiny-tools recipe's, hf backend, as an actor runs it), the actor's episode runner
(`streamrl.actors.environment_episodes`) plays prompts × G episodes of `turns` model turns each; every reply calls a
tool that sleeps `tool_ms` (50 ms) and the episode goes on until `task.max_turns`. The reference is the same prompts
× G completions sampled in one turn with turns × max_new_tokens new tokens: the same budget of model tokens, without
tools. Alternated call by call, so load on the machine falls on both alike.

Reported: model tokens per second of each, their ratio (multi-turn / single-turn), the time the tool calls
took summed (what a runner that waited for each call in turn would add), and the share of the multi-turn
wall time that was not spent sampling (tools the runner could not overlap, rendering, bookkeeping).
"""

from __future__ import annotations

import random
import statistics
import time

import torch

from streamrl.config import Config

# (name, prompts per call, samples per prompt, turns, new tokens per turn, tool sleep in ms)
SHAPES = [("50ms tool", 8, 8, 4, 4, 50), ("0ms tool", 8, 8, 4, 4, 0)]


class _Counting:
    """The backend, counting what its generate calls sample and how long they take."""

    def __init__(self, backend):
        self.backend, self.seconds, self.tokens = backend, 0.0, 0

    def generate(self, prompts, n, between_steps=None):
        t0 = time.perf_counter()
        out = self.backend.generate(prompts, n)
        self.seconds += time.perf_counter() - t0
        self.tokens += sum(len(c.tokens) for cs in out for c in cs)
        return out


def episodes(short: bool = False) -> list[dict]:
    from streamrl import config
    from streamrl.tasks import rewards, tool_calls

    if "bench_every_reply" not in tool_calls.PARSERS:
        # Every reply calls the environment's one tool, so each turn waits on it exactly once.
        tool_calls.PARSERS.register("bench_every_reply")(lambda text, names: [tool_calls.ToolCall(name=names[0])])
    rows = []
    calls = 2 if short else 10
    for name, k, g, turns, per_turn, tool_ms in SHAPES[:1] if short else SHAPES:
        cfg = config.load("tiny-tools.yaml", [f"actors.group_size={g}", f"actors.max_new_tokens={per_turn}",
                                              f"task.max_turns={turns}", "task.tool_parser=bench_every_reply",
                                              f"task.tool_workers={k * g}"])
        torch.set_num_threads(cfg.actors.threads or torch.get_num_threads())  # as an actor runs
        reward = rewards.build(cfg)
        runner, multi_backend, single_backend = _runners(cfg, reward, turns * per_turn, tool_ms)
        rng = random.Random(0)
        times: dict[str, list[float]] = {"multi": [], "single": []}
        tokens = {"multi": 0, "single": 0}
        tool_s = sample_s = 0.0
        for call in range(calls + 1):  # call 0 warms both paths up
            prompts = [reward.task.sample(rng) for _ in range(k)]
            torch.manual_seed(call)
            before = multi_backend.tokens
            t0 = time.perf_counter()
            sampled_before = multi_backend.seconds
            _, stats, done = runner.make_groups(prompts, 0)
            wall = time.perf_counter() - t0
            if call:
                times["multi"].append(wall)
                tokens["multi"] += multi_backend.tokens - before
                tool_s += stats.tool_s
                sample_s += multi_backend.seconds - sampled_before
            ids = [runner._renderer({}).ids(runner._renderer({}).text([{"role": "user", "content": p.text}], True))
                   for p in prompts]
            torch.manual_seed(call)
            before = single_backend.tokens
            t0 = time.perf_counter()
            single_backend.generate(ids, g)
            if call:
                times["single"].append(time.perf_counter() - t0)
                tokens["single"] += single_backend.tokens - before
        runner.close()
        multi_tps = tokens["multi"] / sum(times["multi"])
        single_tps = tokens["single"] / sum(times["single"])
        rows.append({"bench": "episodes", "shape": name, "episodes": k * g, "turns": turns,
                     "tokens_per_turn": per_turn, "tool_ms": tool_ms, "calls": calls,
                     "multi_turn_tokens_per_s": multi_tps, "single_turn_tokens_per_s": single_tps,
                     "ratio_vs_single_turn": multi_tps / single_tps,
                     "multi_turn_call_s": statistics.median(times["multi"]),
                     "tool_s_per_call": tool_s / calls,
                     "not_sampling_fraction": 1 - sample_s / sum(times["multi"])})
    return rows


def _runners(cfg: Config, reward, single_tokens: int, tool_ms: float):
    """(the multi-turn runner, its backend, a single-turn backend allowed all its turns' tokens at once), on one model;
    the runner's environment sleeps tool_ms in its tool."""
    import msgspec

    from streamrl.actors import backends
    from streamrl.actors.environment_episodes import EnvironmentEpisodes
    from streamrl.models import model as model_lib

    model, tok = model_lib.build(cfg, reward.task.vocabulary)
    multi_backend = _Counting(backends.build("hf", cfg, model, tok))
    single_cfg = msgspec.structs.replace(cfg, actors=msgspec.structs.replace(cfg.actors, max_new_tokens=single_tokens))
    single_backend = _Counting(backends.build("hf", single_cfg, model, tok))
    runner = EnvironmentEpisodes(cfg, multi_backend, tok, reward, "bench", multi_backend.backend.eos_ids)
    runner.env_cls = _sleeping_env(tool_ms / 1e3)
    return runner, multi_backend, single_backend


def _sleeping_env(seconds: float) -> type:
    class Sleeping:
        """Every episode: the prompt's key as the user's message; one tool that sleeps, then answers "a"."""

        def __init__(self, row: dict):
            self.key = row["key"]
            self.tools = [self.wait]

        def wait(self) -> str:
            """Sleep, as a slow tool (a sandbox, a search) would."""
            time.sleep(seconds)
            return "a"

        def reset(self) -> list[dict]:
            return [{"role": "user", "content": self.key}]

        def step(self, reply: str):
            return [], 0.0, True

    return Sleeping
