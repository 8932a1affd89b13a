"""A broken reward function stops the run (streamrl.tasks.reward_health): most of a full window failed raises
UserCodeFailure naming the function, its error and the user's own traceback; a minority only counts."""

from __future__ import annotations

import pytest

from streamrl.tasks.reward_functions import Call, RewardFunctions
from streamrl.tasks.reward_health import FailureWindow, UserCodeFailure, error_line

REWARDS = '''
def needs_target(prompts, completions, **kwargs):
    return [1.0 for _ in kwargs["target"]]

def short(prompts, completions, **kwargs):
    return [0.0] * (len(completions) - 1)

def sometimes(prompts, completions, **kwargs):
    if completions[0] == "boom":
        raise ValueError("one bad sample")
    return [1.0] * len(completions)
'''


@pytest.fixture
def rewards_file(tmp_path):
    path = tmp_path / "user_rewards.py"
    path.write_text(REWARDS)
    return path


def test_the_window_fires_only_when_full_and_more_than_the_threshold_failed():
    w = FailureWindow(window=4, threshold=0.5)
    w.note("f", "raised", "Traceback ...\nKeyError: 'answer'\n")
    w.record("f", "raised", {}, n=3)  # 3 of 3: not full yet
    with pytest.raises(UserCodeFailure) as got:
        w.record("f", None, {"raised": 3})  # full: 3 of 4 > half
    assert got.value.function == "f" and got.value.error == "KeyError: 'answer'" and got.value.counts == {"raised": 3}
    half = FailureWindow(window=4, threshold=0.5)
    half.record("g", "raised", {}, n=2)
    half.record("g", None, {}, n=2)  # exactly half: a minority's run goes on
    never = FailureWindow(window=2, threshold=1.0)
    never.record("h", "raised", {}, n=10)  # threshold 1: never stops


def test_the_failure_names_what_kind_of_code_failed():
    w = FailureWindow(window=2, threshold=0.5, kind="agent")
    with pytest.raises(UserCodeFailure, match="^agent my.py:fn failed on 2 of its last 2 samples") as got:
        w.record("my.py:fn", "timeout", {"timeout": 2}, n=2)
    assert got.value.kind == "agent"
    with pytest.raises(UserCodeFailure, match="^reward function f failed"):
        FailureWindow(window=1, threshold=0.5).record("f", "raised", {})


def test_a_full_window_that_mostly_failed_raises_at_the_record_that_fills_it():
    w = FailureWindow(window=3, threshold=0.5)
    w.record("f", "bad_return", {}, n=2)
    with pytest.raises(UserCodeFailure, match="failed on 2 of its last 3 samples \\(bad_return\\)"):
        w.record("f", None, {})


def test_a_reward_raising_on_every_call_names_itself_its_error_and_the_users_traceback(rewards_file):
    fns = RewardFunctions([f"{rewards_file}:needs_target"], fail_window=8, fail_threshold=0.5, workers=2)
    with pytest.raises(UserCodeFailure) as got:
        fns.score([Call("p", ["a", "b", "c", "d"], [[]] * 4, {}) for _ in range(3)])
    e = got.value
    assert e.function.endswith("user_rewards.py:needs_target") and e.reason == "raised", e
    assert e.error == "KeyError: 'target'", e.error
    assert "user_rewards.py" in e.traceback and "concurrent" not in e.traceback, e.traceback  # the user's frames
    assert e.counts["raised"] >= 8 and e.counts["calls_failed"] >= e.counts["raised"], e.counts
    fns.close()


def test_a_wrong_length_return_stops_likewise(rewards_file):
    fns = RewardFunctions([f"{rewards_file}:short"], fail_window=8, workers=2)
    with pytest.raises(UserCodeFailure, match="bad_return.*expected a list of 4 floats"):
        fns.score([Call("p", ["a", "b", "c", "d"], [[]] * 4, {}) for _ in range(3)])
    fns.close()


def test_levels_off_the_scale_on_most_samples_stop_the_run_naming_the_scale():
    fns = RewardFunctions(["math:sqrt"], levels=[0.0, 0.5, 1.0], fail_window=4, workers=2)
    fns.fns = [lambda prompts, completions, **kw: [0.3] * len(completions)]
    with pytest.raises(UserCodeFailure, match="out_of_scale.*a reward of 0.3; task.reward_levels"):
        fns.score([Call("p", ["a", "b", "c", "d"], [[]] * 4, {})])
    fns.close()


def test_a_minority_of_failing_samples_keeps_scoring(rewards_file):
    fns = RewardFunctions([f"{rewards_file}:sometimes"], fail_window=8, workers=2)
    calls = [Call("p", ["boom" if i % 4 == 0 else "ok"] + ["ok"] * 3, [[]] * 4, {}) for i in range(8)]
    outs = fns.score(calls)
    assert sum(o.failures["raised"] for o in outs) == 2 and fns.totals["calls_failed"] == 4  # 2 groups + 2 retries
    fns.close()


def test_the_error_line_is_a_tracebacks_last_line():
    assert error_line("Traceback (most recent call last):\n  File x\nKeyError: 'a'\n\n") == "KeyError: 'a'"
    assert error_line("") == "(no detail)"


def test_calls_that_hang_past_their_timeout_do_not_stall_scoring_on_a_small_pool():
    import threading

    release = threading.Event()

    def hangs_sometimes(prompts, completions, **kwargs):
        if completions[0] == "hang":
            release.wait(60)
        return [1.0] * len(completions)

    fns = RewardFunctions(["math:sqrt"], timeout_s=0.2, workers=2, fail_window=1000)
    fns.fns = [hangs_sometimes]
    try:
        # 4 groups hang on a 2-thread pool: without the pool growing, the calls queued behind them never start
        calls = [Call("p", ["hang" if i % 3 == 0 else "ok"], [[]], {}) for i in range(12)]
        outs = fns.score(calls)
        assert [o.scores[0] for o in outs] == [None if i % 3 == 0 else 1.0 for i in range(12)]
        assert fns.totals["timeout"] == 4 and fns.hanging == 4
    finally:
        release.set()
    deadline = __import__("time").monotonic() + 10
    while fns.hanging and __import__("time").monotonic() < deadline:
        __import__("time").sleep(0.01)
    assert fns.hanging == 0  # each abandoned call is let go of once it returns
    fns.close()


def test_more_hanging_calls_than_the_actor_can_carry_stop_the_run():
    import threading

    from streamrl.tasks import reward_functions

    release = threading.Event()
    fns = RewardFunctions(["math:sqrt"], timeout_s=0.05, workers=1, fail_window=1000)
    fns.fns = [lambda prompts, completions, **kw: release.wait(60) and [1.0]]
    try:
        with pytest.raises(UserCodeFailure, match="calls still running after task.reward_timeout_s"):
            fns.score([Call("p", ["x"], [[]], {}) for _ in range(reward_functions.ABANDONED_PER_WORKER + 2)])
    finally:
        release.set()
        fns.close()


def test_a_group_with_nothing_scored_rides_in_the_accounting_with_every_failed_call():
    from streamrl.actors.generation import carry_reward_failures
    from streamrl.actors.rollout import RolloutStats

    done = RolloutStats(reward_raised=8, reward_calls_failed=9, groups_unscored=1)
    assert carry_reward_failures([], done, {}) == {"raised": 8, "calls_failed": 9, "groups_unscored": 1}


def test_a_function_failing_on_most_samples_stops_though_its_scored_samples_pass_the_scale_check_too():
    fns = RewardFunctions(["math:sqrt"], fail_window=20, workers=2)
    # 5 of 8 samples raise, each group: the sum's check of the 3 scored ones must not dilute the function's window
    fns.fns = [lambda prompts, completions, **kw: [1.0] * len(completions) if all(c == "ok" for c in completions)
               else (_ for _ in ()).throw(ValueError("most raise"))]
    calls = [Call("p", ["ok"] * 3 + ["bad"] * 5, [[]] * 8, {}) for _ in range(4)]
    with pytest.raises(UserCodeFailure, match="math:sqrt failed on"):
        fns.score(calls)
    fns.close()


def test_a_reward_that_could_score_nothing_stops_the_run_naming_itself_and_what_it_returned():
    # TRL's "could not score" on every sample: today's run hung waiting for a first step, counting nothing.
    fns = RewardFunctions(["math:sqrt"], fail_window=8, workers=2)
    fns.fns = [lambda prompts, completions, **kw: [None] * len(completions)]
    with pytest.raises(UserCodeFailure) as got:
        fns.score([Call("p", ["a", "b", "c", "d"], [[]] * 4, {}) for _ in range(3)])
    e = got.value
    assert e.function == "math:sqrt" and e.reason == "none", e
    assert "returned [None, None, None, None]" in str(e) and "could-not-score" in str(e), str(e)
    assert e.counts["none"] >= 8, e.counts
    fns.close()


def test_one_functions_none_beside_anothers_score_is_skipped_and_never_judged_a_failure():
    fns = RewardFunctions(["math:sqrt", "math:floor"], fail_window=4, workers=2)
    fns.fns = [lambda prompts, completions, **kw: [None] * len(completions),  # "not mine to score", always
               lambda prompts, completions, **kw: [1.0] * len(completions)]
    outs = fns.score([Call("p", ["a", "b", "c", "d"], [[]] * 4, {}) for _ in range(4)])
    assert [o.scores for o in outs] == [[1.0] * 4] * 4 and not fns.totals, fns.totals


def test_samples_no_function_of_several_scored_are_judged_together_and_a_minority_only_counts():
    fns = RewardFunctions(["math:sqrt", "math:floor"], fail_window=8, workers=2)
    fns.fns = [lambda prompts, completions, **kw: [None if c == "x" else 1.0 for c in completions],
               lambda prompts, completions, **kw: [None] * len(completions)]
    outs = fns.score([Call("p", ["x", "a", "b", "c"], [[]] * 4, {}) for _ in range(4)])
    assert [o.scores[0] for o in outs] == [None] * 4 and fns.totals["none"] == 4  # counted, never a number
    with pytest.raises(UserCodeFailure, match=r"math:sqrt,math:floor \(together\) failed on .* \(none\)"):
        fns.score([Call("p", ["x", "x", "x", "a"], [[]] * 4, {}) for _ in range(4)])
    fns.close()
