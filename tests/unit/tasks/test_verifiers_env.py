"""task.name: verifiers (streamrl.tasks.verifiers_env): a classic verifiers Environment loaded by id, file or
module, its dataset as the rows, its rubric's weighted reward returned as verifiers gives it (the episode runtime
puts it on the levels: tests/unit/actors/test_episode_runtime.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrl.config import TaskConfig
from streamrl.tasks.verifiers_env import VerifiersTask, load

vf = pytest.importorskip("verifiers.legacy")
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "verifiers-copy" / "copy_env.py"


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
    import random

    from streamrl import config
    from streamrl.actors import backends
    from streamrl.actors.agents import AgentEpisodes
    from streamrl.models import model as model_lib
    from streamrl.tasks import rewards

    (tmp_path / "tool_env.py").write_text(TOOL_ENV)
    cfg = config.load(str(EXAMPLE.parent / "config.yaml"), [
        f"task.verifiers_env={tmp_path / 'tool_env.py'}", "task.verifiers_args={}", "task.reward_levels=[0,1]",
        "advantage.r_min_correct=1", "actors.max_new_tokens=2", f"run_dir={tmp_path}"])
    reward = rewards.build(cfg)
    model, tok = model_lib.build(cfg, reward.task.vocabulary)
    backend = backends.build("hf", cfg, model, tok)
    runner = AgentEpisodes(cfg, 0, backend, tok, reward, "actor-0", backend.eos_ids)
    rng = random.Random(0)
    try:
        groups, stats, done = runner.make_groups([reward.task.sample(rng) for _ in range(8)], version=0)
        turns = runner.turns_log
    finally:
        runner.close()
        reward.close()
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
