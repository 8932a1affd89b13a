"""`streamrl bench trl`: the time-to-reward rule both systems are measured by."""

from __future__ import annotations

import importlib.util

import pytest

from streamrl.commands import bench_trl


def test_time_to_reward_is_the_first_step_whose_trailing_window_mean_reaches_the_target():
    w = bench_trl.WINDOW
    rewards = [0.0] * w + [1.0] * w
    times = [float(i) for i in range(2 * w)]
    # The trailing mean passes 0.5 once half the window is 1.0: step w + w/2 - 1.
    assert bench_trl._first_reaching(rewards, times, 0.5) == times[w + w // 2 - 1]
    assert bench_trl._first_reaching(rewards, times, 1.0) == times[2 * w - 1]


def test_a_target_never_reached_or_fewer_steps_than_the_window_give_none():
    w = bench_trl.WINDOW
    assert bench_trl._first_reaching([0.4] * 3 * w, list(range(3 * w)), 0.5) is None
    assert bench_trl._first_reaching([1.0] * (w - 1), list(range(w - 1)), 0.5) is None


@pytest.mark.skipif(importlib.util.find_spec("trl") is not None, reason="TRL is installed here")
def test_without_trl_the_bench_says_how_to_install_it(tmp_path):
    with pytest.raises(SystemExit, match="pip install trl"):
        bench_trl._trl(["steps=1"], 1, 0.5, tmp_path)
