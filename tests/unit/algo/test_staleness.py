"""streamrl.algo.staleness.gate: lag = learner version - group version; drop above k, refuse the future."""

from __future__ import annotations

import random

import pytest

from streamrl.algo import staleness
from streamrl.comm import wire


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


# --- Throttle: the same rules as state that events change ---------------------------------------

def throttle(k: int = 0, batch: int = 16, actors: int = 2, index: int = 0, **kw) -> staleness.Throttle:
    return staleness.Throttle(batch, actors, index, k, **kw)


def test_throttle_starts_counting_at_the_first_weights_with_the_planned_share():
    t = throttle(k=0, batch=16, actors=3, index=1)
    t.weights(7)
    assert (t.share, t.start_version, t.budget()) == (5, 7, 5)
    t.made(5)
    assert t.budget() == 0  # strict: one share per version, then wait
    t.weights(8)
    assert t.budget() == 5 and t.start_version == 7  # a newer version of the same learner adds one share


def test_throttle_allows_k_versions_ahead():
    t = throttle(k=2, batch=6, actors=2)
    t.weights(0)
    assert t.budget() == 9
    t.made(9)
    assert t.budget() == 0


def test_a_restarted_learner_starts_the_budget_again_at_its_version():
    t = throttle(k=1, batch=8, actors=2)
    t.weights(10)
    t.made(8)
    assert t.budget() == 0
    t.weights(4, life=1)  # resumed from a checkpoint at version 4: older, but a life of its own
    assert (t.start_version, t.produced, t.budget()) == (4, 0, 8)
    assert t.total == 8  # the session's count keeps every group made


def test_a_demand_raises_the_share_from_the_current_version_on():
    t = throttle(k=0, batch=16, actors=2)
    t.weights(3)
    t.made(8)
    t.demand(groups_missing=8)  # the other actor is gone: make the whole batch
    # its own 8 of version 3 are made: the 8 missing ones now, then 16 a version
    assert (t.share, t.start_version, t.produced, t.last_demand, t.budget()) == (16, 3, 8, 3, 8)
    t.made(8)
    t.weights(4)
    assert t.budget() == 16
    t.demand(groups_missing=100)
    assert t.share == 16  # never more than a batch


def test_an_actor_a_demand_does_not_name_keeps_its_share_and_budget_and_a_named_one_takes_on_its_count():
    demand = wire.Demand(version=3, groups_missing=5, counts={"actor-0": 5})  # actor-0 delivered its share
    named, other = throttle(k=0, batch=16, actors=2, index=0), throttle(k=0, batch=16, actors=2, index=1)
    for t in (named, other):
        t.weights(3)
        t.made(3)
    before = (other.share, other.start_version, other.produced, other.budget())
    other.demand(demand.count_for(other.actor_id))  # still making its own share: asked for nothing
    assert (other.share, other.start_version, other.produced, other.budget()) == before and other.share == 8
    named.demand(demand.count_for(named.actor_id))
    assert (named.share, named.start_version, named.budget()) == (13, 3, 5 + 5)  # the rest of its own, then 5
    unnamed = wire.Demand(version=3, groups_missing=5)  # no shares (task.epochs): every actor takes on all of it
    assert unnamed.count_for("actor-1") == 5


def test_a_raised_share_relaxes_after_versions_without_a_demand():
    t = throttle(k=0, batch=16, actors=2, relax_after=5)
    t.weights(0)
    t.demand(8)
    t.weights(4)
    assert not t.relax() and t.share == 16
    t.weights(5)
    assert t.relax() and (t.share, t.start_version, t.produced) == (8, 5, 0)
    assert not t.relax()  # at the planned share there is nothing to relax


def test_an_unthrottled_actor_is_never_told_to_wait():
    t = throttle(k=0, enabled=False)
    t.weights(0)
    t.made(10_000)
    assert t.budget() == staleness.UNLIMITED


def test_the_throttle_keeps_the_rules_the_actor_loop_kept_in_loose_locals():
    # The actor loop before the Throttle, transcribed: random events must give the same budget,
    # share and start at every point.
    rng = random.Random(3)
    for trial in range(50):
        k, batch, actors, index = rng.randint(0, 3), rng.randint(1, 20), rng.randint(1, 4), rng.randint(0, 4)
        t = throttle(k, batch, actors, index, relax_after=5)
        share = base = staleness.planned_share(batch, actors, index)
        version = start = produced = last_demand = restarts = 0
        t.weights(0)
        for _ in range(60):
            event = rng.choice(["weights", "weights", "made", "made", "demand", "restart"])
            if event == "weights":
                version += rng.randint(1, 3)
            elif event == "restart":
                version, restarts = rng.randint(0, 20), restarts + 1
                start, produced = version, 0
            elif event == "made":
                n = rng.randint(0, 6)
                produced += n
                t.made(n)
            t.weights(version, restarts)
            if event == "demand":
                missing = rng.randint(1, 8)
                made_ahead = (1 + k) * share - staleness.generation_budget(version, start, produced, share, k)
                share = min(batch, share + missing)
                start, produced, last_demand = version, made_ahead, version
                t.demand(missing)
            if share > base and version - last_demand >= 5:
                share, start, produced = base, version, 0
            t.relax()
            assert (t.share, t.start_version, t.produced) == (share, start, produced), (trial, event)
            assert t.budget() == staleness.generation_budget(version, start, produced, share, k)


def test_lag_works_elementwise_on_tensors():
    import torch

    assert staleness.lag(5, torch.tensor([5, 3, 4])).tolist() == [0, 2, 1]


# --- Pacing: the learner's lead (drift) and who shares a batch (wire.Pace) ----------------------

def test_a_pace_with_lead_zero_holds_an_actor_to_one_share_per_version_and_the_full_lead_lets_it_run_ahead():
    t = throttle(k=2, batch=16, actors=2)
    t.weights(0)
    t.made(8)
    t.pace(1, lead=0, actors=staleness.planned_actors(2))  # drift over the bound: hold
    assert t.budget() == 0  # its share of version 0 is made: wait for newer weights instead of running ahead
    t.weights(1)
    assert t.budget() == 8
    t.pace(2, lead=2, actors=staleness.planned_actors(2))  # drift within the bound again
    assert t.budget() == 24
    t.pace(3, lead=99, actors=staleness.planned_actors(2))
    assert t.lead == 2  # never past max_staleness, whatever a message says


def test_an_actor_beyond_the_planned_ones_makes_nothing_until_a_pace_counts_it_in_at_the_next_version():
    t = throttle(k=0, batch=16, actors=2, index=2)  # `streamrl actor --index 2` joining a run of two
    t.weights(150)
    assert (t.share, t.budget()) == (0, 0)  # the two planned actors make version 150's batch
    t.pace(151, lead=0, actors=["actor-0", "actor-1", "actor-2"])
    assert t.budget() == 0  # counted in from version 151, not before
    t.weights(151)
    assert (t.share, t.budget()) == (5, 5)


@pytest.mark.parametrize("k", [0, 2])
def test_a_share_changed_by_a_pace_keeps_the_groups_made_ahead_of_the_learner(k):
    t = throttle(k=k, batch=16, actors=2, index=0)
    t.weights(10)
    t.made((1 + k) * 8)  # run to the bound: k versions' shares ahead of version 10's
    t.pace(11, lead=k, actors=["actor-0", "actor-1", "actor-2"])
    t.weights(11)
    # From version 11 the learner takes 6 a version: the k × 8 made ahead of it are of versions 11.. already.
    assert (t.share, t.start_version, t.produced) == (6, 11, k * 8)
    assert t.budget() == {0: 6, 2: 2}[k]  # (1 + k) × 6 less the k × 8 already made


@pytest.mark.parametrize("batch, n", [(16, 3), (16, 5), (7, 2), (3, 3)])
def test_paced_shares_add_up_to_exactly_one_batch_and_others_make_none(batch, n):
    actors = [f"actor-{i}" for i in (4, 0, 9, 1, 2)][:n]
    assert sum(staleness.paced_share(batch, actors, a) for a in actors) == max(batch, n)
    assert staleness.paced_share(batch, actors, "actor-77") == 0
