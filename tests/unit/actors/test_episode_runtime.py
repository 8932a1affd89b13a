"""The actor's one rollout protocol (streamrl.actors.rollouts): the task says how its samples are made, and one rule
puts every episode's return on the task's levels, whether an environment or an agent gave it."""

from __future__ import annotations

import random
import textwrap
from types import SimpleNamespace
from pathlib import Path

import pytest

from streamrl import config
from streamrl.actors import backends, rollouts
from streamrl.actors.environment_episodes import EnvironmentEpisodes
from streamrl.actors.rollout import RolloutOptions
from streamrl.models import model as model_lib
from streamrl.models.sampling import Completion
from streamrl.tasks import rewards
from streamrl.tasks.base import TaskDefaults

COPY_AGENT = Path(__file__).resolve().parents[3] / "examples" / "copy-agent"


class _Answers:
    """A policy that always replies `answer a` (then <eos>)."""

    def __init__(self, tok):
        self.tok = tok

    def generate(self, prompts, n, between_steps=None):
        toks = self.tok.encode("answer a") + [self.tok.eos_token_id]
        return [[Completion(tokens=toks, logprobs=[-0.5] * len(toks), finish_reason="stop")] * n for _ in prompts]


def _environment_run(tmp_path, reward_given: float):
    env = tmp_path / "given_env.py"
    env.write_text(textwrap.dedent(f"""
        class Given:
            def __init__(self, row):
                self.row = row
            def reset(self):
                return [{{"role": "user", "content": self.row["prompt"]}}]
            def step(self, reply):
                return [], {reward_given!r}, True
    """))
    cfg = config.load("tiny-tools.yaml", ["actors.group_size=2", f"task.environment={env}:Given"])
    reward = rewards.build(cfg)
    _, tok = model_lib.build(cfg, reward.task.vocabulary)
    runner = EnvironmentEpisodes(cfg, _Answers(tok), tok, reward, "actor-0", [tok.eos_token_id])
    return _play(runner, reward)


def _play(runner, reward):
    """(groups, stats, counts) of one call of the runner on two of the task's prompts."""
    rng = random.Random(0)
    try:
        return runner.make_groups([reward.task.sample(rng) for _ in range(2)], 0)
    finally:
        runner.close()


def test_an_environments_reward_within_the_tolerance_is_the_tasks_level(tmp_path):
    groups, stats, done = _environment_run(tmp_path, 0.999)  # the lookup task's levels: 0, .25, .5, 1
    assert [list(g.rewards) for g in groups] == [[1.0, 1.0], [1.0, 1.0]] and stats.step_raised == 0


def test_an_environments_reward_on_no_level_fails_the_episode_never_rounded(tmp_path):
    groups, stats, done = _environment_run(tmp_path, 0.7)  # levels 0, .25, .5, 1
    assert groups == [] and stats.step_raised == 4 and done.groups_unscored == 2


def _agent_run(tmp_path, value: float):
    pytest.importorskip("openai")
    agent = tmp_path / "agent.py"
    agent.write_text(textwrap.dedent(f"""
        def agent(client, row):
            client.chat.completions.create(model="policy", messages=[{{"role": "user", "content": "a"}}],
                                           max_tokens=1)
            return {value!r}
    """))
    cfg = config.load(str(COPY_AGENT / "config.yaml"), [
        f"task.data={COPY_AGENT / 'train.jsonl'}", f"task.agent={agent}:agent", "actors.group_size=2",
        f"run_dir={tmp_path}"])
    reward = rewards.build(cfg)
    model, tok = model_lib.build(cfg, reward.task.vocabulary)
    backend = backends.build("hf", cfg, model, tok)
    options = RolloutOptions.from_config(cfg)
    runner = rollouts.runner(cfg, 0, backend, tok, reward, "actor-0", backend.eos_ids, options, None)
    return _play(runner, reward)


def test_an_agents_return_within_the_tolerance_is_the_tasks_level(tmp_path):
    groups, _, done = _agent_run(tmp_path, 0.74999)  # levels 0, .25, .5, .75, 1; tolerance 0.01
    assert [list(g.rewards) for g in groups] == [[0.75, 0.75], [0.75, 0.75]] and done.reward_out_of_scale == 0


def test_an_agents_return_on_no_level_is_out_of_scale_never_rounded(tmp_path):
    groups, _, done = _agent_run(tmp_path, 0.6)  # verifiers' rubric rewards once rounded this to 0.5
    # counted and unscored (never trained as a level it was not on): nothing of either group is sent
    assert done.reward_out_of_scale == 4 and groups == [] and done.groups_unscored == 2


def test_a_tasks_capabilities_say_how_its_samples_are_made():
    bare, env_cfg = config.load("tiny.yaml", []).task, config.load("tiny-tools.yaml", []).task
    assert config.rollout_kind(bare) == "single_turn"
    assert config.rollout_kind(env_cfg) == "environment_episodes"  # task.environment: its episodes
    for name, kind in (("agent", "agent_episodes"), ("skyrl_gym", "environment_episodes"),
                       ("openenv", "environment_episodes"), ("verifiers", "agent_episodes"),
                       ("reverse", "single_turn")):  # what each declares, not its name
        assert config.rollout_kind(SimpleNamespace(name=name, environment="")) == kind, name
    assert TaskDefaults().environment_class() is None


def test_a_single_turn_task_gets_the_single_turn_rollout():
    cfg = config.load("tiny.yaml", [])
    reward = rewards.build(cfg)
    options = RolloutOptions.from_config(cfg)
    runner = rollouts.runner(cfg, 0, None, None, reward, "actor-0", [], options, random.Random(0))
    assert isinstance(runner, rollouts.SingleTurn)
