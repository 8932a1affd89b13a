"""The dealer: every prompt of every epoch ends in exactly one final outcome, whatever the actors and learner do."""

from __future__ import annotations

import collections
import random

import pytest

from streamrl.tasks import epochs
from streamrl.tasks.dealer import Dealer, Ticket


def _simulate(seed: int, rows: int = 13, n_epochs: int = 3, max_deals: int = 50) -> tuple[list, Dealer]:
    """A random interleaving of actors joining, dying (their groups in flight may still arrive), groups trained,
    filtered, failed and dropped, checkpoints and learner restarts (the ledger cut back to the checkpoint).
    Returns the ledger (every Final accepted) and the last dealer."""
    rng = random.Random(seed)
    dealer = Dealer(rows, n_epochs, seed=7, max_deals=max_deals)
    ledger: list = []
    saved = (dealer.cursor(), 0)
    live, flight, next_id = ["a0"], [], 1  # flight: (session, ticket) groups on their way to the learner
    for _ in range(100_000):
        if dealer.finished and not flight:
            break
        r = rng.random()
        if r < 0.05:
            live.append(f"a{next_id}")
            next_id += 1
        elif r < 0.08 and len(live) > 1:  # an actor dies; the learner notices (some of its groups still arrive)
            dead = live.pop(rng.randrange(len(live)))
            flight = [g for g in flight if g[0] != dead or rng.random() < 0.3]
            ledger += dealer.lost(dead)
        elif r < 0.10:
            saved = (dealer.cursor(), len(ledger))
        elif r < 0.12:  # learner SIGKILLed: back to the checkpoint; the actors and their groups in flight live on
            cursor, kept = saved
            dealer = Dealer.restore(cursor, rows, 7, n_epochs, max_deals)
            del ledger[kept:]
        elif r < 0.45:
            s = rng.choice(live)
            flight += [(s, t) for t in dealer.deal(s, rng.randint(1, 4))]
        elif flight:
            s, t = flight.pop(rng.randrange(len(flight)))
            what = rng.choices(["trained", "filtered", "failed", "dropped"], [70, 5, 2, 23])[0]
            got = dealer.outcome(s, t, what, reason="test")
            if got:
                ledger.append(got)
    else:
        raise AssertionError("the simulation did not finish")
    return ledger, dealer


@pytest.mark.parametrize("seed", range(200))
def test_every_prompt_of_every_epoch_ends_in_exactly_one_outcome(seed):
    ledger, dealer = _simulate(seed)
    finals = collections.Counter(f.ticket for f in ledger)
    assert finals == collections.Counter({Ticket(e, r): 1 for e in range(3) for r in range(13)})
    assert dealer.finished and not dealer.deal("late", 5)
    by_epoch = collections.Counter((f.ticket.epoch, f.outcome) for f in ledger)
    for e in range(3):  # the dealer's own counts agree with the ledger it handed out
        assert {k: by_epoch[(e, k)] for k in ("trained", "filtered", "failed")} == \
            {k: dealer.counts[e][k] for k in ("trained", "filtered", "failed")}


def test_an_epoch_is_dealt_in_its_seeded_order_and_ends_after_the_last():
    d = Dealer(5, 2, seed=1)
    got = d.deal("a", 100)
    assert got == [Ticket(0, r) for r in epochs.order(5, 1, 0)] + [Ticket(1, r) for r in epochs.order(5, 1, 1)]
    assert d.deal("a", 1) == [] and d.dealt_out and not d.finished


def test_a_dropped_prompt_is_dealt_again_before_new_ones_and_counted():
    d = Dealer(4, 1, seed=0)
    first, second = d.deal("a", 2)
    assert d.outcome("a", first, "dropped", "stale") is None
    assert d.deal("b", 1) == [first] and d.counts[0]["redealt"] == 1
    assert d.outcome("a", first, "trained") is False  # a's late group: b holds the prompt now
    assert d.outcome("b", first, "trained").outcome == "trained"


def test_a_filtered_prompt_is_recorded_not_replaced():
    d = Dealer(2, 1, seed=0)
    a, b = d.deal("s", 2)
    assert d.outcome("s", a, "filtered", "zero variance").outcome == "filtered"
    d.outcome("s", b, "trained")
    assert d.finished and d.deal("s", 1) == [] and d.counts[0]["filtered"] == 1


def test_a_prompt_dropped_max_deals_times_fails_with_the_reason():
    d = Dealer(1, 1, seed=0, max_deals=2)
    (t,) = d.deal("a", 1)
    assert d.outcome("a", t, "dropped", "unscorable") is None
    d.deal("a", 1)
    f = d.outcome("a", t, "dropped", "unscorable")
    assert f.outcome == "failed" and "dealt 2 times" in f.reason and "unscorable" in f.reason and d.finished


def test_a_lost_session_gives_its_prompts_back():
    d = Dealer(3, 1, seed=0)
    held = d.deal("dead", 2)
    assert d.lost("dead") == [] and sorted(d.deal("b", 3)[:2]) == sorted(held)


def test_a_resume_with_other_data_or_seed_is_refused_by_name():
    cursor = Dealer(10, 2, seed=3).cursor()
    with pytest.raises(ValueError, match="rows=10, this run has rows=11"):
        Dealer.restore(cursor, 11, 3, 2)
    with pytest.raises(ValueError, match="seed=3, this run has seed=4"):
        Dealer.restore(cursor, 10, 4, 2)


def test_an_unknown_outcome_is_refused_naming_the_allowed_ones():
    d = Dealer(1, 1, seed=0)
    with pytest.raises(ValueError, match="allowed: trained, filtered, failed, dropped"):
        d.outcome("a", d.deal("a", 1)[0], "skipped")
