"""Fuzz every receiving socket with malformed messages: each one is rejected with a reason, counted,
logged once per kind, and the socket still takes valid messages afterwards."""

from __future__ import annotations

import json
import logging
import time

import msgspec
import pytest
import torch
import zmq
from fakes import malformed
from fakes.pubsub import joined

from streamrl.comm import wire
from streamrl.comm.control import ControlServer, Inbox
from streamrl.comm.groups import GroupReceiver
from streamrl.comm.weights import assembly, chunks
from streamrl.comm.weights.publisher import WeightPublisher
from streamrl.comm.weights.subscriber import WeightSubscriber

pytestmark = pytest.mark.timeout(120)
ANY = "tcp://127.0.0.1:*"
N = 10_000


def _endpoint(sock: zmq.Socket) -> str:
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def test_ten_thousand_malformed_groups_are_each_rejected_counted_and_logged_once_per_kind(caplog):
    ctx = zmq.Context()
    receiver = GroupReceiver(ctx, ANY, hwm=1000, max_bytes=1 << 20, vocab_size=malformed.VOCAB,
                             reward_range=malformed.REWARD_RANGE)
    push = ctx.socket(zmq.PUSH)
    push.connect(_endpoint(receiver.sock))
    msgs = malformed.messages(N, seed=1)
    taken = 0
    with caplog.at_level(logging.WARNING, logger="streamrl.comm.sockets"):
        for _, frames in msgs:
            push.send_multipart(frames)
            while receiver.take() is not None:
                taken += 1
        deadline = time.monotonic() + 30
        while receiver.rejected.total < N and time.monotonic() < deadline:
            taken += receiver.take() is not None
    assert taken == 0 and receiver.received == 0
    assert receiver.rejected.total == N  # every one counted, none lost, none accepted
    assert len(receiver.rejected.counts) >= 12  # told apart by reason
    assert receiver.rejected.counts["reward_out_of_range"] > 0  # finite, well-formed, and not the run's scale
    assert len(caplog.records) == len(receiver.rejected.counts)  # one log line per kind, not per message
    good = malformed._group(malformed.random.Random(0))
    push.send_multipart(good)
    deadline = time.monotonic() + 5
    while (group := receiver.take()) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert group is not None and group.actor_id == "fuzz"  # still serving
    push.close(0)
    receiver.close()
    ctx.term()


def test_malformed_weight_broadcasts_and_replies_are_rejected_and_the_next_good_one_is_taken():
    ctx = zmq.Context()
    pub, router = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
    pub.bind(ANY)
    router.bind(ANY)
    inbox = Inbox(ctx, _endpoint(router), "actor-0", max_bytes=1 << 20)
    sub = WeightSubscriber(ctx, _endpoint(pub), inbox, max_bytes=1 << 20)
    joined(pub, sub.sub)  # PUB drops what it sends before the subscription arrives
    msgs = malformed.weight_messages(3_000, seed=2)
    sub.request(have_version=-1)
    identity, _ = router.recv_multipart()
    deadline = time.monotonic() + 60

    def drain(expected: int) -> None:
        while sub.rejected.total < expected and time.monotonic() < deadline:
            assert sub.poll(10) is None

    # PUB and ROUTER drop what a full subscriber queue cannot hold (by design: only the newest
    # weights matter), so the fuzzer waits for each small batch to be taken in.
    for start in range(0, len(msgs), 2):
        for _, frames in msgs[start:start + 2]:
            pub.send_multipart(frames)
        drain(start + 2)
    for start in range(0, 500, 2):  # garbage as replies on the request channel too
        for _, frames in msgs[start:start + 2]:
            router.send_multipart([identity, *frames])
        drain(3_000 + start + 2)
    assert sub.rejected.total == 3_500
    pub.send_multipart(chunks.encode_weights(7, {"w": torch.ones(2)})[0])
    got = None
    while got is None and time.monotonic() < deadline:
        got = sub.poll(50)
    assert got is not None and got[0] == 7 and got[1]["w"].tolist() == [1.0, 1.0]
    sub.close()
    inbox.close()
    pub.close(0)
    router.close(0)
    ctx.term()


def test_malformed_weight_requests_are_rejected_and_a_real_one_is_still_served():
    ctx = zmq.Context()
    publisher = WeightPublisher(ctx, ANY, 1 << 20)
    control = ControlServer(ctx, ANY, publisher)
    publisher.publish(3, {"w": torch.zeros(1)})
    publisher.flush()
    listener = ctx.socket(zmq.SUB)
    listener.setsockopt(zmq.SUBSCRIBE, b"")
    listener.connect(_endpoint(publisher.pub))
    joined(publisher.pub, listener)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(_endpoint(control.sock))
    msgs = malformed.messages(2_000, seed=3)
    for _, frames in msgs:
        dealer.send_multipart(frames)
    deadline = time.monotonic() + 30
    while control.rejected.total < 2_000 and time.monotonic() < deadline:
        control.serve()
        time.sleep(0.001)
    assert control.rejected.total == 2_000 and publisher.requests_served == 0
    dealer.send_multipart(wire.encode(wire.WeightsRequest(actor_id="actor-0")))
    while control.serve() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert listener.poll(5000)  # answered by sending version 3 again
    assert assembly.decode_weights([listener.recv_multipart()])[0] == 3
    listener.close(0)
    dealer.close(0)
    control.close()
    publisher.close()
    ctx.term()


def test_a_message_above_the_size_limit_is_refused_without_being_buffered_and_the_receiver_goes_on():
    ctx = zmq.Context()
    receiver = GroupReceiver(ctx, ANY, hwm=16, max_bytes=4096, vocab_size=malformed.VOCAB)
    huge = ctx.socket(zmq.PUSH)
    huge.connect(_endpoint(receiver.sock))
    huge.send_multipart([b"\x00" * (64 << 20)])  # ZeroMQ drops the connection at the first oversized frame
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        assert receiver.take() is None
        time.sleep(0.01)
    good = ctx.socket(zmq.PUSH)
    good.connect(_endpoint(receiver.sock))
    good.send_multipart(malformed._group(malformed.random.Random(0)))
    deadline = time.monotonic() + 5
    while (group := receiver.take()) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert group is not None and receiver.rejected.total == 0
    for s in (huge, good):
        s.close(0)
    receiver.close()
    ctx.term()


def _taken(receiver: GroupReceiver, until, timeout_s: float = 10) -> list:
    got, deadline = [], time.monotonic() + timeout_s
    while not until() and time.monotonic() < deadline:
        if (g := receiver.take()) is not None:
            got.append(g)
        else:
            time.sleep(0.005)
    return got


def test_a_group_sent_twice_is_dropped_as_a_duplicate_and_a_forged_report_is_flagged_not_balanced():
    from streamrl.comm.groups import GroupSender
    from streamrl.learner.intake import Intake

    ctx = zmq.Context()
    receiver = GroupReceiver(ctx, ANY, hwm=1000, max_bytes=1 << 20, vocab_size=malformed.VOCAB,
                             reward_range=malformed.REWARD_RANGE)
    publisher = WeightPublisher(ctx, ANY, 1 << 20)
    control = ControlServer(ctx, ANY, publisher)
    intake = Intake(receiver, control, group_size=2, max_staleness=1)
    sender = GroupSender(ctx, _endpoint(receiver.sock), hwm=1000, actor_id="fuzz")
    good = malformed.wire.decode_header(malformed._group(malformed.random.Random(0)))
    groups = malformed.codec.decode_groups(malformed._group(malformed.random.Random(0)), good)
    for i in range(20):
        assert sender.send(groups[0], timeout_s=2)
        if i % 10 == 9:  # every 10th group again: same session, same sequence number (a replay)
            sender.sent -= 1
            assert sender.send(groups[0], timeout_s=2)
    got = _taken(receiver, lambda: receiver.received >= 22)
    assert len(got) == 20 and receiver.duplicates == 2 and [g.seq for g in got] == list(range(20))
    intake.used = 20
    clean = intake.reconciliation()
    assert clean["balanced"] and clean["duplicates"] == 2 and clean["lost_in_transit"] == 0
    assert intake.accounting()["groups_dropped"] == {"duplicate": 2}
    # A report claiming far more than the session's own numbering says it sent: flagged, and never balanced.
    sender.sent = 10**9
    assert sender.report(groups_generated=10**9, reason="shutdown")
    _taken(receiver, lambda: receiver.sessions[("fuzz", sender.session)].report is not None)
    forged = intake.reconciliation()
    assert not forged["balanced"] and forged["lost_in_transit"] == 10**9 - 20
    assert f"fuzz/{sender.session}" in forged["contradicted_sessions"]
    for s in (sender, receiver, control, publisher):
        s.close()
    ctx.term()


def test_a_resumed_receiver_goes_on_from_its_checkpoints_counts_and_counts_what_the_dead_learner_took():
    ctx = zmq.Context()
    receiver = GroupReceiver(ctx, ANY, hwm=1000, max_bytes=1 << 20, vocab_size=malformed.VOCAB)
    push = ctx.socket(zmq.PUSH)
    push.connect(_endpoint(receiver.sock))
    frames = malformed._batch(malformed.random.Random(0))  # seqs 0..k-1 of session fuzz-session
    push.send_multipart(frames)
    k = len(malformed.wire.decode_header(frames).groups)
    _taken(receiver, lambda: receiver.received >= k)
    state = json.loads(json.dumps(receiver.state()))  # what a checkpoint keeps, through JSON
    receiver.close()
    again = GroupReceiver(ctx, ANY, hwm=1000, max_bytes=1 << 20, vocab_size=malformed.VOCAB)
    again.restore(state)
    push.close(0)
    push = ctx.socket(zmq.PUSH)
    push.connect(_endpoint(again.sock))
    header = msgspec.msgpack.decode(frames[0])
    for i, g in enumerate(header["groups"]):  # the same session goes on at seq k + 5: 5 went to the dead learner
        g[malformed._ENTRY_FIELDS.index("seq")] = k + 5 + i
    push.send_multipart([msgspec.msgpack.encode(header), *frames[1:]])
    _taken(again, lambda: again.received >= 2 * k)
    count = again.sessions[("fuzz", "fuzz-session")]
    assert again.received == 2 * k and count.received == 2 * k and count.restart_lost == 5
    assert count.lost == 0 and count.contradiction is None
    push.close(0)
    again.close()
    ctx.term()
