"""streamrl.staleness.gate: lag = learner version - group version; drop above k, refuse the future."""

from __future__ import annotations

import pytest

from streamrl import staleness


@pytest.mark.parametrize("k", [0, 1, 2, 5])
def test_gate_admits_every_lag_from_zero_to_k(k):
    learner = 10
    for lag in range(k + 1):
        assert staleness.gate(learner, learner - lag, k) == "ok"


@pytest.mark.parametrize("k", [0, 1, 2, 5])
def test_gate_drops_groups_staler_than_k(k):
    learner = 10
    for lag in (k + 1, k + 2, learner):
        assert staleness.gate(learner, learner - lag, k) == "stale"


@pytest.mark.parametrize("ahead", [1, 2, 100])
def test_gate_calls_a_version_the_learner_never_made_future(ahead):
    assert staleness.gate(3, 3 + ahead, max_staleness=1000) == "future"
    assert staleness.gate(0, ahead, max_staleness=0) == "future"


def test_strict_mode_is_staleness_zero():
    assert staleness.gate(7, 7, 0) == "ok"
    assert staleness.gate(7, 6, 0) == "stale"


def test_lag_is_learner_minus_group_version():
    assert staleness.lag(9, 4) == 5
    assert staleness.lag(4, 9) == -5


def test_generation_budget_in_strict_mode_is_one_share_per_version():
    # k = 0, share 4: at the start version 4 groups, then none until the next version arrives.
    assert staleness.generation_budget(5, 5, 0, 4, 0) == 4
    assert staleness.generation_budget(5, 5, 3, 4, 0) == 1
    assert staleness.generation_budget(5, 5, 4, 4, 0) == 0
    assert staleness.generation_budget(6, 5, 4, 4, 0) == 4


def test_generation_budget_allows_k_extra_shares_ahead():
    # (versions seen 1 + k 2) * share 3 = 9 groups before the first new version
    assert staleness.generation_budget(0, 0, 0, 3, 2) == 9
    assert staleness.generation_budget(0, 0, 9, 3, 2) == 0
    assert staleness.generation_budget(2, 0, 9, 3, 2) == 6


def test_generation_budget_is_never_negative():
    assert staleness.generation_budget(0, 0, 100, 3, 1) == 0


@pytest.mark.parametrize("batch, actors", [(16, 3), (16, 2), (16, 5), (3, 4), (16, 1), (7, 7)])
def test_planned_shares_add_up_to_exactly_one_batch(batch, actors):
    shares = [staleness.planned_share(batch, actors, i) for i in range(actors)]
    assert sum(shares) == max(batch, actors) and max(shares) - min(shares) <= 1
