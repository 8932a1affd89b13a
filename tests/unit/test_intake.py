"""learner.intake: the staleness gate on a live socket, and when the learner asks for more groups."""

from __future__ import annotations

import time

import pytest
import zmq

from learner.intake import Intake
from streamrl import wire
from streamrl.transport import GroupReceiver, GroupSender, WeightPublisher

pytestmark = pytest.mark.timeout(30)
ANY = "tcp://127.0.0.1:*"


@pytest.fixture
def intake():
    ctx = zmq.Context()
    receiver = GroupReceiver(ctx, ANY, hwm=64, max_bytes=1 << 20, vocab_size=32)
    publisher = WeightPublisher(ctx, ANY, ANY, 1 << 20)
    sender = GroupSender(ctx, receiver.sock.getsockopt_string(zmq.LAST_ENDPOINT), hwm=64)
    yield Intake(receiver, publisher, group_size=2, max_staleness=1, demand_after_s=0.3), sender
    for s in (sender, receiver, publisher):
        s.close()
    ctx.term()


def group(version: int, size: int = 2) -> wire.ScoredGroup:
    return wire.ScoredGroup.from_samples(
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
