"""task.name: verifiers (streamrl.tasks.verifiers_env): a classic verifiers Environment loaded by id, file or
module, its dataset as the rows, its rubric's weighted reward returned as verifiers gives it (the episode runtime
puts it on the levels: tests/unit/actors/test_episode_runtime.py)."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from streamrl.config import TaskConfig
from streamrl.tasks.verifiers_env import VerifiersTask, load

vf = pytest.importorskip("verifiers.legacy")
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "verifiers-copy" / "copy_env.py"


def _sampled(k: int):
    """A pick of k prompts the task samples with one seeded generator."""
    def pick(task):
        rng = random.Random(0)
        return [task.sample(rng) for _ in range(k)]
    return pick


def _played(tmp_path, config_yaml, overrides, pick=_sampled(8)):
    """An actor's agent runner for the config, playing the prompts `pick(task)` chooses, closed after: a namespace
    of cfg, tok, prompts, groups, stats, done, turns (runner.turns_log) and runner."""
    from streamrl import config
    from streamrl.actors import backends
    from streamrl.actors.agents import AgentEpisodes
    from streamrl.models import model as model_lib
    from streamrl.tasks import rewards

    cfg = config.load(str(config_yaml), [*overrides, f"run_dir={tmp_path}"])
    reward = rewards.build(cfg)
    model, tok = model_lib.build(cfg, reward.task.vocabulary)
    backend = backends.build("hf", cfg, model, tok)
    runner = AgentEpisodes(cfg, 0, backend, tok, reward, "actor-0", backend.eos_ids)
    prompts = pick(reward.task)
    try:
        groups, stats, done = runner.make_groups(prompts, version=0)
    finally:
        runner.close()
        reward.close()
    return SimpleNamespace(cfg=cfg, tok=tok, prompts=prompts, groups=groups, stats=stats, done=done,
                           turns=runner.turns_log, runner=runner, vocabulary=reward.task.vocabulary)


def test_the_environments_own_dataset_is_the_rows_with_its_answers():
    task = VerifiersTask(TaskConfig(name="verifiers", opts={"verifiers_env": str(EXAMPLE), "verifiers_args": {
                                    "symbols": "ab", "length": 2}}, reward_levels=[0.0, 0.5, 1.0]))
    assert len(task.train) == 4  # every ab string of length 2
    row = task.train[0]
    assert row.prompt == ({"role": "user", "content": "copy : a a ="},) and row.columns["answer"] == "a a"
    assert "example_id" in row.columns
    assert set(task.vocabulary) == {"copy", ":", "a", "b", "="}  # example ids are no words
    assert task.agent_fn.kind == "verifiers environment" and task.agent_fn.__name__ == "verifiers:copy_env.py"


def test_an_environment_is_named_by_file_by_module_loader_or_installed_id(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    assert isinstance(load(str(EXAMPLE), {}), vf.SingleTurnEnv)
    assert isinstance(load("copy_env:load_environment", {"length": 1}), vf.SingleTurnEnv)
    assert load("copy-env", {"symbols": "xy", "length": 1}).get_dataset().num_rows == 2  # an id: its module
    with pytest.raises(ValueError, match="no installed environment module 'no-such-env'"):
        load("no-such-env", {})
    (tmp_path / "not_env.py").write_text("def load_environment(**kw):\n    return 42\n")
    with pytest.raises(ValueError, match="returned a int, not a verifiers Environment"):
        load(str(tmp_path / "not_env.py"), {})


def test_the_config_asks_for_an_environment_with_the_verifiers_task_only():
    with pytest.raises(ValueError, match="task 'verifiers': Object missing required field `verifiers_env`"):
        TaskConfig(name="verifiers")
    with pytest.raises(ValueError, match="verifiers_env='copy_env': an option of task 'verifiers', which this run"):
        TaskConfig(name="copy", opts={"verifiers_env": "copy_env"})


TOOL_ENV = '''
import verifiers as vf
from datasets import Dataset


def load_environment(**kwargs):
    def a(x: str) -> str:
        """The tool the tiny model calls by writing `a <x>`."""
        return "b"

    def used_the_tool(completion, **kwargs) -> float:
        return float(any(m["role"] == "tool" for m in completion))

    rows = [{"question": f"copy : {s} =", "answer": s} for s in ("a b", "b a", "a a", "b b")]
    return vf.ToolEnv(dataset=Dataset.from_list(rows), tools=[a], max_turns=3,
                      rubric=vf.Rubric(funcs=[used_the_tool]))
'''


def test_a_tool_env_keeps_its_tools_and_max_turns_through_the_endpoint(tmp_path):
    """verifiers' own ToolEnv: the endpoint hands the model's `a <x>` back as an OpenAI tool call, verifiers runs
    the tool, and its rubric sees the tool message; an episode ends when a reply calls no tool, or at max_turns."""
    (tmp_path / "tool_env.py").write_text(TOOL_ENV)
    run = _played(tmp_path, EXAMPLE.parent / "config.yaml", [
        f"task.verifiers_env={tmp_path / 'tool_env.py'}", "task.verifiers_args={}", "task.reward_levels=[0,1]",
        "advantage.r_min_correct=1", "actors.max_new_tokens=2"])
    cfg, tok, groups, stats, done, turns = run.cfg, run.tok, run.groups, run.stats, run.done, run.turns
    assert len(groups) == 8 and done.reward_raised == done.reward_timeout == 0
    by_episode: dict[str, list] = {}
    for t in turns:
        by_episode.setdefault(t.episode, []).append(t)
    first_words = {e: tok.decode(ts[0].completion_ids, skip_special_tokens=True).split()[:1] for e, ts in
                   by_episode.items()}
    for e, ts in by_episode.items():
        assert 1 <= len(ts) <= 3  # max_turns, kept
        assert (len(ts) > 1) == (first_words[e] == ["a"])  # a tool call, and only one, gets another turn
    rewards_of = [r for g in groups for r in g.rewards]
    called = sum(len(ts) > 1 for ts in by_episode.values())
    # The rubric sees the tool message in the completion once the next turn says something (an empty reply is
    # verifiers' EmptyModelResponseError: the rollout ends errored, before that step is kept).
    answered = sum(len(ts) > 1 and bool(tok.decode(ts[1].completion_ids, skip_special_tokens=True).strip())
                   for ts in by_episode.values())
    assert called > 0 and rewards_of.count(1.0) == answered  # ~1 in 10 replies calls a: 64 episodes
    empty = sum(not tok.decode(ts[-1].completion_ids, skip_special_tokens=True).strip() for ts in by_episode.values())
    assert stats.truncated.get("verifiers_EmptyModelResponseError", 0) == empty  # counted, as verifiers ended them
    # the samples log holds each episode's turns in order: the model's, verifiers' tool result, the model's again
    from streamrl.comm import codec
    from streamrl.learner.samples import records

    received = codec.decode_groups([bytes(memoryview(f).cast("B")) for f in codec.encode_groups(groups)])
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731  (as the learner decodes)
    logged = [r for g in received for r in records([g], 0, 0, cfg, decode, 64)]
    roles = [[(t["role"], t.get("tools")) for t in r["conversation"]] for r in logged]
    assert sorted(sum(role == "model" for role, _ in rs) for rs in roles) == sorted(map(len, by_episode.values()))
    assert all(rs[::2] == [("model", None)] * len(rs[::2]) and rs[1::2] == [("tool", ["a"])] * len(rs[1::2])
               for rs in roles), roles
    assert sum(r["tool_calls"].get("a/answered", 0) for r in logged) == sum(len(ts) - 1 for ts in by_episode.values())


MULTI_TURN = EXAMPLE.parents[1] / "verifiers-multiturn"


def test_the_docs_multi_turn_env_plays_two_turns_with_the_environments_reply_between(tmp_path):
    """examples/verifiers-multiturn (the verifiers page's MultiTurnEnv, shown verbatim: tests/unit/core/
    test_docs_agree.py): each rollout is two model turns, the second prompted with the env_response's
    `reverse : <answer> =`, its @vf.stop ending it, and the rubric's half-per-turn levels are the rewards."""
    run = _played(tmp_path, MULTI_TURN / "config.yaml", [
        f"task.verifiers_env={MULTI_TURN / 'copy_reverse_env.py'}", "task.verifiers_args={symbols: ab, length: 2}",
        "actors.max_new_tokens=3"], _sampled(4))
    assert "reverse" in run.vocabulary  # task.vocabulary: the environment's word, in no row
    cfg, tok, groups, stats, done, turns = run.cfg, run.tok, run.groups, run.stats, run.done, run.turns
    assert len(groups) == 4 and done.reward_raised == done.reward_timeout == 0
    by_episode: dict[str, list] = {}
    for t in turns:
        by_episode.setdefault(t.episode, []).append(t)
    assert len(by_episode) == 4 * cfg.actors.group_size
    for ts in by_episode.values():  # @vf.stop ends it at two; an empty first reply is verifiers' error, at one
        said_nothing = not tok.decode(ts[0].completion_ids, skip_special_tokens=True).strip()
        assert len(ts) == (1 if said_nothing else 2), ts
        if len(ts) == 2:
            second_prompt = tok.decode(ts[1].prompt_ids, skip_special_tokens=True)
            assert second_prompt.rstrip().endswith("=") and "reverse :" in second_prompt, second_prompt
    assert sum(len(ts) == 2 for ts in by_episode.values()) > 0

    def rubric(ts) -> float:  # the example's turns_right, from the turns the learner trains on
        if len(ts) < 2:
            return 0.0
        said = [tok.decode(t.completion_ids, skip_special_tokens=True).split() for t in ts]
        answer = tok.decode(ts[1].prompt_ids, skip_special_tokens=True).rsplit("reverse :", 1)[1].split()[:-1]
        return 0.5 * (said[0] == answer) + 0.5 * (said[1] == answer[::-1])

    assert sorted(r for g in groups for r in g.rewards) == sorted(rubric(ts) for ts in by_episode.values())


BROKEN_ENV = '''
import verifiers as vf
from datasets import Dataset


class Broken(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        return state["missing"]


def load_environment(**kwargs):
    rows = [{"question": f"copy : {s} =", "answer": s} for s in ("a b", "b a")]
    return Broken(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[lambda completion, **kw: 0.0]),
                  max_turns=3)
'''


def test_a_verifiers_envs_failure_shows_no_streamrl_frame_above_the_environments(tmp_path):
    """An exception out of the environment's own code reaches the failure window through verifiers' rollout, the
    event loop and streamrl's agent runner: the traceback shown starts past streamrl's frames and the loop's
    (verifiers' own first, then the environment's file: docs/guides/faults-and-security.md "Your own frames")."""
    import re

    path = tmp_path / "broken_env.py"
    path.write_text(BROKEN_ENV)
    runner = _played(tmp_path, EXAMPLE.parent / "config.yaml", [
        f"task.verifiers_env={path}", "task.verifiers_args={}", "task.reward_levels=[0,1]", "advantage.r_min_correct=1",
        "actors.max_new_tokens=2"], _sampled(4)).runner
    (reason, tb), = runner.health.first.values()
    frames = re.findall(r'File "([^"]+)"', tb)
    assert reason == "raised" and str(path) in frames and tb.rstrip().endswith("KeyError: 'missing'"), tb
    streamrls = tuple(str(EXAMPLE.parents[2] / d) + "/" for d in ("streamrl", "actors"))
    assert "/verifiers/" in frames[0] and not any(f.startswith(streamrls) for f in frames[:frames.index(str(path))]), tb


RUBRIC_ENV = '''
import verifiers as vf
from datasets import Dataset


def none_unless_b(completion, answer, **kwargs):
    return 1.0 if "b" in answer else None


def none_on_aa(completion, answer, **kwargs):
    if answer == "b b":
        raise KeyError("no such field")
    return None if answer == "a a" else 0.0


def load_environment():
    rows = [{"question": f"copy : {s} =", "answer": s} for s in ("a a", "a b", "b b")]
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[none_unless_b, none_on_aa]))
'''


def test_a_rubric_function_that_raised_or_nobody_could_score_leaves_the_rollout_unscored_and_counted(tmp_path):
    """verifiers scores a raising or None-returning rubric function 0.0; streamrl's one rule: a raise is `raised`
    (unscored, the function's traceback kept), every function's None is `none`, one None beside a number skipped."""
    (tmp_path / "rubric_env.py").write_text(RUBRIC_ENV)
    run = _played(tmp_path, EXAMPLE.parent / "config.yaml", [
        f"task.verifiers_env={tmp_path / 'rubric_env.py'}", "task.verifiers_args={}", "task.reward_levels=[0,1]",
        "advantage.r_min_correct=1", "actors.max_new_tokens=2", "actors.group_size=2"],
        lambda task: [task.prompt(r) for r in reversed(task.train)])  # "b b" first: its failure's detail kept
    prompts, groups, done, runner = run.prompts, run.groups, run.done, run.runner
    answers = {p.id: p.columns["answer"] for p in prompts}
    assert [(answers[g.prompt_id], g.rewards) for g in groups] == [("a b", [1.0, 1.0])]  # 1.0 + 0.0
    assert (done.reward_none, done.reward_raised, done.groups_unscored) == (2, 2, 2)
    reason, detail = runner.health.first[runner.name]
    assert "none_on_aa" in detail and "KeyError: 'no such field'" in detail, detail
