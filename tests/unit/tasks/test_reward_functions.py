"""Reward functions by reference (streamrl.tasks.reward_functions): TRL's signature, a group per call,
failures counted by reason and confined to the samples that caused them."""

from __future__ import annotations

import math

import pytest

from streamrl.tasks import Prompt
from streamrl.tasks.dataset import DatasetTask
from streamrl.tasks.reward_functions import Call, RewardFunctions, resolve

REWARDS = '''
import math, time
CALLS = []

def exact(prompts, completions, answer, **kwargs):
    CALLS.append(len(completions))
    return [1.0 if (c[0]["content"] if isinstance(c, list) else c) == a else 0.0 for c, a in zip(completions, answer)]

def moody(prompts, completions, **kwargs):
    CALLS.append(len(completions))
    out = []
    for c in completions:
        if c == "boom":
            raise RuntimeError("boom")
        if c == "slow":
            time.sleep(0.6)
        out.append({"nan": math.nan, "off": 0.3, "none": None}.get(c, 1.0))
    return out

def wrong_length(prompts, completions, **kwargs):
    return [1.0]
'''


@pytest.fixture
def rewards_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(REWARDS)
    return path


def test_a_reference_names_a_module_or_a_file_and_a_bad_one_says_what_is_allowed(rewards_file):
    assert resolve("math:sqrt") is math.sqrt
    assert resolve(f"{rewards_file}:exact").__name__ == "exact"
    with pytest.raises(ValueError, match="give 'package.module:function'"):
        resolve("no_colon")
    with pytest.raises(ValueError, match="has no function 'nope'"):
        resolve(f"{rewards_file}:nope")
    with pytest.raises(ValueError, match="cannot import 'not_a_module_xyz'"):
        resolve("not_a_module_xyz:f")


def test_a_chat_group_is_one_call_in_trls_shapes_with_the_other_columns_as_lists(rewards_file):
    seen = {}

    def spy(prompts, completions, completion_ids, **columns):
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, columns=columns)
        return [0.0] * len(completions)

    import streamrl.tasks.reward_functions as rf

    fns = rf.RewardFunctions(["math:sqrt"])
    fns.fns = [spy]
    messages = ({"role": "system", "content": "s"}, {"role": "user", "content": "u"})
    call = DatasetTask.call(Prompt(id="p", text="s\nu", messages=messages, columns={"answer": "x", "n": 3}),
                            ["a", "b"], [[1], [2, 3]])
    assert fns.score([call])[0].scores == [0.0, 0.0]
    assert seen["prompts"] == [list(messages)] * 2
    assert seen["completions"] == [[{"role": "assistant", "content": "a"}], [{"role": "assistant", "content": "b"}]]
    assert seen["ids"] == [[1], [2, 3]] and seen["columns"] == {"answer": ["x", "x"], "n": [3, 3]}


def test_failures_are_counted_by_reason_and_cost_only_their_own_samples(rewards_file):
    fns = RewardFunctions([f"{rewards_file}:moody"], levels=[0.0, 0.5, 1.0], timeout_s=0.3, workers=8)
    texts = ["ok", "boom", "slow", "nan", "off", "none", "ok", "ok"]
    out = fns.score([Call("p", texts, [[]] * 8, {})])[0]
    assert out.scores == [1.0, None, None, None, None, None, 1.0, 1.0]
    # samples by reason; calls_failed: every failed call (the group's, then the retries of boom and slow)
    assert dict(out.failures) == {"raised": 1, "timeout": 1, "non_finite": 1, "out_of_scale": 1, "none": 1,
                                  "calls_failed": 3}
    fns.close()


def test_a_bad_return_is_counted_and_weights_add_functions_up(rewards_file):
    bad = RewardFunctions([f"{rewards_file}:wrong_length"])
    out = bad.score([Call("p", ["a", "b"], [[], []], {})])[0]
    # each sample's own call returns one value: every sample scored, the group's call counted as failed
    assert out.scores == [1.0, 1.0] and dict(out.failures) == {"calls_failed": 1}
    weighted = RewardFunctions([f"{rewards_file}:exact", f"{rewards_file}:exact"], weights=[0.25, 0.5],
                               levels=[0.0, 0.75])
    got = weighted.score([Call("p", ["x", "y"], [[], []], {"answer": "x"})])[0]
    assert got.scores == [0.75, 0.0]


def test_groups_score_side_by_side_on_the_pool():
    import threading

    together = threading.Barrier(4, timeout=20)

    def meet(prompts, completions, **kwargs):  # returns only once all four groups' calls are running at once
        together.wait()
        return [1.0] * len(completions)

    fns = RewardFunctions(["math:sqrt"], timeout_s=30, workers=4)
    fns.fns = [meet]
    outs = fns.score([Call("p", ["a"], [[]], {}) for _ in range(4)])
    assert [o.scores for o in outs] == [[1.0]] * 4 and not any(o.failures for o in outs)  # one at a time: broken
    fns.close()


def test_unscored_samples_take_their_groups_mean_and_a_group_with_none_scored_is_marked():
    from streamrl.actors.rollout import fill_unscored

    assert fill_unscored([1.0, None, 0.0, None]) == [1.0, 0.5, 0.0, 0.5]
    assert all(math.isnan(r) for r in fill_unscored([None, None]))


def test_a_group_marks_the_samples_whose_reward_stands_in_for_a_score_unscored():
    from streamrl.actors.rollout import _group, fill_unscored
    from streamrl.models.sampling import Completion

    drawn = [Completion(tokens=[3, 4], logprobs=[-0.1, -0.2], finish_reason="stop") for _ in range(3)]
    samples = list(zip(drawn, ["a"] * 3, fill_unscored([1.0, None, 0.0])))
    group = _group("p", [1, 2], samples, 0, "actor-0")
    assert group.rewards == [1.0, 0.5, 0.0] and group.scored == [True, False, True]


def test_reward_failures_reach_prometheus_by_reason():
    from prometheus_client import generate_latest

    from streamrl.actors.rollout import RolloutStats
    from streamrl.telemetry import actor_metrics, prometheus_metrics

    registry = prometheus_metrics.new_registry()
    m = actor_metrics.ActorMetrics(registry, "run", "actor-0")
    m.observe_rollout(RolloutStats(reward_raised=3, reward_timeout=2, groups_unscored=1))
    m.observe_rollout(RolloutStats(reward_raised=1))
    text = generate_latest(registry).decode()
    assert 'streamrl_actor_reward_failures_total{actor="actor-0",reason="raised",run="run"} 4.0' in text
    assert 'streamrl_actor_reward_failures_total{actor="actor-0",reason="timeout",run="run"} 2.0' in text
    assert 'streamrl_actor_groups_unscored_total{actor="actor-0",run="run"} 1.0' in text


def test_a_continuous_reward_is_bucketed_onto_the_configured_levels(tmp_path):
    from streamrl import config as config_lib
    from streamrl.tasks import rewards

    (tmp_path / "rows.jsonl").write_text('{"prompt": "say x", "answer": "x"}\n')
    (tmp_path / "cont.py").write_text("def f(prompts, completions, **kw):\n"
                                      "    return [len(c) / 10 for c in completions]\n")
    cfg = config_lib.load(None, ["task.name=dataset", f"task.data={tmp_path / 'rows.jsonl'}",
                                 f"task.reward={tmp_path / 'cont.py'}:f", "reward.bucket_edges=[0.3, 0.6]",
                                 "advantage.r_min_correct=0.5"])
    reward = rewards.build(cfg)
    assert reward.levels == [0.0, 0.5, 1.0] == cfg.reward_levels()
    prompt = reward.task.sample(__import__("random").Random(0))
    scored, failures = reward.score_groups([prompt], [["ab", "abcd", "abcdefgh"]], [[[], [], []]])
    assert scored == [[0.0, 0.5, 1.0]] and not failures


def test_a_trl_reward_function_works_unchanged_on_a_chat_group():
    pytest.importorskip("trl")
    fns = RewardFunctions(["trl.rewards:think_format_reward"], levels=[0.0, 1.0])
    call = DatasetTask.call(Prompt(id="p", text="q", messages=({"role": "user", "content": "q"},)),
                            ["<think>\nbecause\n</think>\n42", "42"], [[1], [2]])
    out = fns.score([call])[0]
    assert out.scores == [1.0, 0.0] and not out.failures


@pytest.mark.parametrize("shape", ["floats", "numpy floats", "numpy array", "tensor", "0-d tensors", "tuple"])
def test_a_reward_in_any_shape_trl_accepts_is_scored(shape):
    import numpy as np
    import torch

    make = {"floats": lambda v: v, "numpy floats": lambda v: [np.float32(x) for x in v],
            "numpy array": lambda v: np.array(v, dtype=np.float64), "tensor": lambda v: torch.tensor(v),
            "0-d tensors": lambda v: [torch.tensor(x) for x in v], "tuple": tuple}[shape]
    fns = RewardFunctions(["math:sqrt"], levels=[0.0, 0.5, 1.0])
    fns.fns = [lambda prompts, completions, **kw: make([1.0, 0.5, 0.0])]
    out = fns.score([Call("p", ["a", "b", "c"], [[]] * 3, {})])[0]
    assert out.scores == [1.0, 0.5, 0.0] and not out.failures, (shape, out.failures)
    fns.close()


def test_none_in_a_numpy_return_or_a_list_is_not_applicable_and_a_string_is_a_bad_return():
    fns = RewardFunctions(["math:sqrt"])
    fns.fns = [lambda prompts, completions, **kw: [None, 1.0] if completions[0] == "a" else ["1.0"]]
    out = fns.score([Call("p", ["a", "b"], [[]] * 2, {})])[0]
    assert out.scores == [None, 1.0] and dict(out.failures) == {"none": 1}
    bad = fns.score([Call("p", ["x"], [[]], {})])[0]
    assert bad.scores == [None] and bad.failures["bad_return"] == 1
    fns.close()


def test_a_reward_within_the_tolerance_of_a_level_is_that_level():
    fns = RewardFunctions(["math:sqrt"], levels=[0.0, 0.33, 0.67, 1.0], level_tolerance=0.01)
    fns.fns = [lambda prompts, completions, **kw: [0.0, 1 / 3, 2 / 3, 1.0, 0.5]]
    out = fns.score([Call("p", list("abcde"), [[]] * 5, {})])[0]
    assert out.scores == [0.0, 0.33, 0.67, 1.0, None] and dict(out.failures) == {"out_of_scale": 1}
    exact = RewardFunctions(["math:sqrt"], levels=[0.0, 1 / 3, 1.0], level_tolerance=0.01)
    exact.fns = [lambda prompts, completions, **kw: [0.33, 0.3334]]
    assert exact.score([Call("p", ["a", "b"], [[]] * 2, {})])[0].scores == [1 / 3, 1 / 3]
    fns.close()
    exact.close()
