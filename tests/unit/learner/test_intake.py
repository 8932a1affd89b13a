"""learner.intake: the staleness gate on a live socket, and when the learner asks for more groups."""

from __future__ import annotations

import time

import pytest
import zmq

from streamrl.comm import codec
from streamrl.comm.control import ControlServer
from streamrl.comm.groups import GroupReceiver, GroupSender
from streamrl.comm.weights.publisher import WeightPublisher
from streamrl.learner.intake import Intake

pytestmark = pytest.mark.timeout(30)
ANY = "tcp://127.0.0.1:*"


@pytest.fixture
def intake():
    ctx = zmq.Context()
    receiver = GroupReceiver(ctx, ANY, hwm=64, max_bytes=1 << 20, vocab_size=32)
    publisher = WeightPublisher(ctx, ANY, 1 << 20)
    control = ControlServer(ctx, ANY, publisher)
    sender = GroupSender(ctx, receiver.sock.getsockopt_string(zmq.LAST_ENDPOINT), hwm=64, actor_id="a")
    yield Intake(receiver, control, group_size=2, max_staleness=1, demand_after_s=0.3), sender
    for s in (sender, receiver, control, publisher):
        s.close()
    ctx.term()


def group(version: int, size: int = 2) -> codec.ScoredGroup:
    return codec.ScoredGroup.from_samples(
        prompt_id="p", policy_version=version, actor_id="a", prompt_tokens=[1, 2], completions=[[3]] * size,
        logprobs=[[-1.0]] * size, rewards=[0.0] * size, finish_reasons=["length"] * size)


def test_collect_keeps_groups_within_the_bound_and_counts_the_rest_by_reason(intake):
    it, sender = intake
    for g in (group(5), group(3), group(4), group(6), group(5, size=3), group(5)):
        assert sender.send(g, timeout_s=2)
    batch, _ = it.collect(version=5, n=3, timeout_s=10)
    assert [g.policy_version for g in batch] == [5, 4, 5]
    assert it.dropped == {"stale": 1, "future": 1, "wrong_group_size": 1}
    assert it.used == 3 and it.received == 6


def test_a_silence_far_longer_than_usual_gaps_sends_a_demand_and_a_short_one_does_not(intake):
    it, sender = intake
    it.gaps.extend([0.05, 0.1])
    assert it.demand_wait_s == pytest.approx(0.3)  # the configured floor
    it.gaps.append(2.0)  # actors that take 2 s per generate call are slow, not gone
    assert it.demand_wait_s == pytest.approx(6.0)
    it.gaps.clear()
    assert sender.send(group(0), timeout_s=2)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="have 1/2"):
        it.collect(version=0, n=2, timeout_s=1.0)
    assert time.monotonic() - t0 < 5
    assert it.demands_sent >= 1


# ── Accounting ──────────────────────────────────────────────────────────────────────────────────

def test_a_sender_numbers_its_groups_and_its_report_closes_the_session_with_nothing_missing(intake):
    it, sender = intake
    for v in (0, 0, 0):
        assert sender.send(group(v), timeout_s=2)
    assert sender.report(groups_generated=4, reason="shutdown")
    batch, _ = it.collect(version=0, n=2, timeout_s=10)
    assert [(g.session, g.seq) for g in batch] == [(sender.session, 0), (sender.session, 1)]
    it.drain(timeout_s=5)
    count = it.receiver.sessions["a", sender.session]
    assert count.report.groups_sent == 3 and count.received == 3 and count.max_seq == 2
    r = it.reconciliation()
    assert r["groups_sent_by_actors"] == 3 and r["groups_generated_by_actors"] == 4
    assert r["lost_in_transit"] == 0 and r["unreported_sessions"] == [] and r["balanced"]
    assert it.dropped["lost_at_shutdown"] == 1  # the third group arrived after the last batch


def test_a_batch_cut_short_by_a_stop_is_counted_lost_at_shutdown_not_used(intake):
    it, sender = intake
    assert sender.send(group(0), timeout_s=2)
    batch, _ = it.collect(version=0, n=2, timeout_s=10, stop=lambda: it.receiver.received >= 1)  # stop once it came
    assert batch == [] and it.used == 0
    assert it.dropped["lost_at_shutdown"] == 1 and it.reconciliation()["balanced"]


def _broken(sender) -> bool:
    """The actor's word that a user's function fails on most samples (as reward_health says it)."""
    from streamrl.comm import wire

    return sender.notice(wire.ActorFailure(actor_id="a", session=sender.session, function="said.py:said",
                                           reason="raised", failed=7, window=10, error="KeyError: 'x'",
                                           traceback="..."), timeout_s=2)


def test_a_run_a_broken_user_function_stops_still_balances_the_groups_its_last_batch_had_taken(intake):
    from streamrl.learner.intake import UserCodeFailed

    it, sender = intake
    for v in (0, 0, 0):
        assert sender.send(group(v), timeout_s=2)
    assert _broken(sender)
    with pytest.raises(UserCodeFailed, match="said.py:said failed on 7 of its last 10"):
        it.collect(version=0, n=4, timeout_s=10)
    it.drain(timeout_s=0.3)  # what the learner's shutdown does next
    assert it.used == 0 and it.received == 3
    assert it.dropped == {"lost_at_failure": 3}, it.dropped  # taken for the batch, never trained
    assert it.reconciliation()["balanced"]


def test_a_data_timeout_and_a_strict_refusal_count_the_groups_taken_so_far_and_the_one_in_hand(intake):
    from streamrl.learner.stepstats import StrictModeViolation

    it, sender = intake
    it.strict, it.max_staleness = True, 0
    for v in (5, 4):  # the stale one raises at its verdict, in hand
        assert sender.send(group(v), timeout_s=2)
    with pytest.raises(StrictModeViolation):
        it.collect(version=5, n=3, timeout_s=10)
    assert it.dropped == {"lost_at_failure": 2} and it.reconciliation()["balanced"]
    assert sender.send(group(5), timeout_s=2)
    with pytest.raises(TimeoutError, match="have 1/2"):
        it.collect(version=5, n=2, timeout_s=0.5)
    assert it.dropped == {"lost_at_failure": 3} and it.received == 3 and it.reconciliation()["balanced"]


def test_a_session_that_never_reports_is_listed_and_drain_gives_up_after_its_timeout(intake):
    it, sender = intake
    for v in (0, 0):
        assert sender.send(group(v), timeout_s=2)
    it.collect(version=0, n=2, timeout_s=10)
    t0 = time.monotonic()
    it.drain(timeout_s=0.5)  # the "actor" was killed: no report will come
    assert 0.4 < time.monotonic() - t0 < 3
    r = it.reconciliation()
    assert r["unreported_sessions"] == [f"a/{sender.session}"] and r["groups_sent_by_actors"] == 2
    assert r["balanced"]


def test_claimed_sessions_cannot_grow_the_learners_memory_without_bound(intake, monkeypatch):
    it, sender = intake
    monkeypatch.setattr("streamrl.comm.groups.MAX_SESSIONS", 3)
    for i in range(6):
        g = group(0)
        sender.session = f"s{i}"
        sender.sent = 0
        assert sender.send(g, timeout_s=2)
    deadline = time.monotonic() + 5
    while it.received < 6 and time.monotonic() < deadline:
        it.receiver.take()
    assert len(it.receiver.sessions) == 4  # three real, one overflow bucket
    assert it.receiver.sessions["(too many sessions)", ""].received == 3


def test_groups_left_over_from_a_batch_message_fill_the_next_batch_without_waiting_on_the_socket(intake, monkeypatch):
    it, sender = intake
    assert sender.send_batch([group(5) for _ in range(4)], timeout_s=2)
    first, _ = it.collect(version=5, n=2, timeout_s=10)
    waits: list = []
    wait = it.wait
    monkeypatch.setattr(it, "wait", lambda timeout_ms: waits.append(timeout_ms) or wait(timeout_ms))
    second, _ = it.collect(version=5, n=2, timeout_s=10)
    assert waits == [0]  # one look at the socket, no 100 ms wait on it: the groups were already here
    assert [g.seq for g in first + second] == [0, 1, 2, 3]
    assert it.used == it.received == 4


def test_strict_mode_refuses_a_stale_group_loudly_instead_of_dropping_it(intake):
    from streamrl.learner.stepstats import StrictModeViolation

    it, sender = intake
    it.strict, it.max_staleness = True, 0
    for g in (group(5), group(4)):
        assert sender.send(g, timeout_s=2)
    with pytest.raises(StrictModeViolation, match="generated at policy version 4 arrived at learner version 5 "
                                                  r"\(lag 1; strict needs 0\)"):
        it.collect(version=5, n=2, timeout_s=10)


def test_strict_mode_drops_a_stale_group_a_demand_explains_and_still_refuses_one_from_before_it(intake):
    from streamrl.learner.stepstats import StrictModeViolation

    it, sender = intake
    it.strict, it.max_staleness = True, 0
    it.first_demand_version = 3  # actors were asked to cover at version 3: they made more than their share since
    for g in (group(5), group(3), group(5)):
        assert sender.send(g, timeout_s=2)
    batch, _ = it.collect(version=5, n=2, timeout_s=10)
    assert [g.policy_version for g in batch] == [5, 5] and it.dropped["stale"] == 1
    assert sender.send(group(2), timeout_s=2)  # older than the demand: nothing explains it
    with pytest.raises(StrictModeViolation, match="generated at policy version 2"):
        it.collect(version=5, n=1, timeout_s=10)


def test_no_demand_goes_out_before_the_first_group_of_the_run_arrives(intake):
    it, _ = intake
    with pytest.raises(TimeoutError, match="have 0/2"):
        it.collect(version=0, n=2, timeout_s=1.0)  # > demand_after_s (0.3), yet nothing to measure slowness by
    assert it.demands_sent == 0


def test_the_sessions_poller_answers_a_weight_request_while_the_intake_waits_for_groups():
    import torch

    from streamrl.comm.control import Inbox
    from streamrl.comm.weights.subscriber import WeightSubscriber
    from streamrl.learner.session import Poller

    ctx = zmq.Context()
    receiver = GroupReceiver(ctx, ANY, hwm=64, max_bytes=1 << 20, vocab_size=32)
    publisher = WeightPublisher(ctx, ANY, 1 << 20)
    control = ControlServer(ctx, ANY, publisher)
    publisher.publish(4, {"w": torch.ones(2)})
    publisher.flush()  # sent before the actor subscribed: only its request can bring it
    inbox = Inbox(ctx, control.sock.getsockopt_string(zmq.LAST_ENDPOINT), "late", 1 << 20)
    sub = WeightSubscriber(ctx, publisher.pub.getsockopt_string(zmq.LAST_ENDPOINT), inbox, 1 << 20)
    it = Intake(receiver, control, group_size=2, max_staleness=1, wait=Poller(receiver, control))

    def waiting_for_groups() -> bool:  # the learner's side while the actor waits: no group comes
        with pytest.raises(TimeoutError):
            it.collect(version=4, n=1, timeout_s=0.2)
        return False

    try:
        got = sub.wait_for(4, timeout_s=5.0, ask_first=True, ask_every_s=0.3, stop=waiting_for_groups)
        assert got is not None and got[0] == 4 and publisher.requests_served >= 1
    finally:
        for s in (sub, inbox, control, publisher, receiver):
            s.close()
        ctx.term()


def test_ten_thousand_sessions_keep_the_summarys_accounting_within_its_reserved_space(intake):
    import json

    from streamrl.comm.groups import SessionCount
    from streamrl.learner.runlog import SUMMARY_RESERVE_BYTES

    it, _ = intake
    for i in range(10_000):  # actors killed before they reported, each a session
        it.receiver.sessions[(f"actor-{i}", f"{i:012x}")] = SessionCount(received=3, max_seq=2)
    it.receiver.received = it.used = 30_000
    part = json.dumps({**it.accounting(), "reconciliation": it.reconciliation()})
    assert len(part) < SUMMARY_RESERVE_BYTES // 4, len(part)
    r = it.reconciliation()
    assert r["unreported_session_count"] == 10_000 and r["actor_sessions"] == 10_000 and r["balanced"]
    assert len(it.sessions()) == 10_000  # the whole detail, for sessions.json
