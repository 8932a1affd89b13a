"""`streamrl bench trl`: the time-to-reward rule both systems are measured by, and its `--short` pass."""

from __future__ import annotations

import importlib.util

import pytest

from streamrl.bench import trl as bench_trl

HAS_TRL = importlib.util.find_spec("trl") is not None


def test_time_to_reward_is_the_first_step_whose_trailing_window_mean_reaches_the_target():
    w = bench_trl.WINDOW
    rewards = [0.0] * w + [1.0] * w
    times = [float(i) for i in range(2 * w)]
    # The trailing mean passes 0.5 once half the window is 1.0: step w + w/2 - 1.
    assert bench_trl._first_reaching(rewards, times, 0.5) == times[w + w // 2 - 1]
    assert bench_trl._first_reaching(rewards, times, 1.0) == times[2 * w - 1]
    assert bench_trl._step_reaching(rewards, 0.5) == w + w // 2


def test_a_target_never_reached_or_fewer_steps_than_the_window_give_none():
    w = bench_trl.WINDOW
    assert bench_trl._first_reaching([0.4] * 3 * w, list(range(3 * w)), 0.5) is None
    assert bench_trl._first_reaching([1.0] * (w - 1), list(range(w - 1)), 0.5) is None
    assert bench_trl._step_reaching([0.0] * 3 * w, 0.5) is None


def test_the_spread_is_min_median_max_and_says_when_a_run_missed_the_target():
    assert bench_trl._spread([3.0, 1.0, 2.0]) == "1.0 / 2.0 / 3.0"
    assert bench_trl._spread([3.0, None, 2.0]) == "not reached in 1 of 3"


@pytest.mark.skipif(HAS_TRL, reason="TRL is installed here")
def test_without_trl_the_bench_says_how_to_install_it(tmp_path):
    with pytest.raises(SystemExit, match="pip install trl"):
        bench_trl._trl(["steps=1"], 1, 0.5, tmp_path)


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRL, reason="needs TRL (the test extra installs it)")
def test_short_bench_trains_both_systems_in_fresh_processes_and_prints_the_table(capsys):
    rows = bench_trl.trl(short=True)
    assert [(r["task"], r["target"]) for r in rows] == [("copy 8x6", t) for t in bench_trl.TARGETS]
    for r in rows:
        for system in ("streamrl", "trl"):
            assert r[f"{system}_ms_per_step"][0] > 0  # both trained, each clock read from its own process
        assert r["trl_threads"] >= 1
    table = capsys.readouterr().out
    assert table.count("| copy 8x6 |") == len(bench_trl.TARGETS)
