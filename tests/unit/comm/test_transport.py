"""streamrl.comm's channels over loopback TCP in one process: groups, rejects, weights, control (late joiners,
demand, shutdown)."""

from __future__ import annotations

import time

import msgspec
import numpy as np
import pytest
import torch
import zmq
from fakes.pubsub import joined

from streamrl.comm import codec, wire
from streamrl.comm.control import ControlServer, Inbox
from streamrl.comm.groups import GroupReceiver, GroupSender
from streamrl.comm.weights import assembly, chunks
from streamrl.comm.weights.publisher import WeightPublisher
from streamrl.comm.weights.subscriber import WeightSubscriber

pytestmark = pytest.mark.timeout(30)

ANY = "tcp://127.0.0.1:*"  # the OS picks a free port; LAST_ENDPOINT tells which
VOCAB = 32
MAX_BYTES = 1 << 20


@pytest.fixture
def zmq_ctx():
    """A context plus `track(obj)`: every tracked socket or channel is closed before the context terms."""
    ctx = zmq.Context()
    things = []

    def track(obj):
        things.append(obj)
        return obj

    yield ctx, track
    for obj in reversed(things):
        obj.close(linger=0) if isinstance(obj, zmq.Socket) else obj.close()
    ctx.term()


def bound(sock: zmq.Socket) -> str:
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def _learner(ctx, track, max_bytes: int = MAX_BYTES, **kw) -> tuple[WeightPublisher, ControlServer]:
    """The learner's weight publisher and the control server that answers requests through it."""
    pub = track(WeightPublisher(ctx, ANY, max_bytes=max_bytes, **kw))
    return pub, track(ControlServer(ctx, ANY, pub))


def _subscriber(ctx, track, pub_addr: str, router_addr: str, actor_id: str, max_bytes: int, **kw) -> WeightSubscriber:
    """An actor's weight subscriber, with the control inbox it asks for weights through."""
    return WeightSubscriber(ctx, pub_addr, track(Inbox(ctx, router_addr, actor_id, max_bytes)), max_bytes, **kw)


def _raw_pusher(ctx, track, receiver: GroupReceiver) -> zmq.Socket:
    """A bare PUSH socket aimed at `receiver`, for sending frames the project would never make."""
    raw = track(ctx.socket(zmq.PUSH))
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(bound(receiver.sock))
    return raw


def make_group(version=0, tokens=(9, 10, 11)) -> codec.ScoredGroup:
    return codec.ScoredGroup.from_samples(
        prompt_id="copy-ab", policy_version=version, actor_id="actor-0", prompt_tokens=[5, 6],
        completions=[list(tokens), [12]], logprobs=[[-0.5] * len(tokens), [-1.0]], rewards=[1.0, 0.5],
        finish_reasons=["stop", "length"])


def take(receiver: GroupReceiver, timeout_s: float = 5.0) -> codec.ScoredGroup | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        receiver.sock.poll(50)
        got = receiver.take()
        if got is not None:
            return got
    return None


def test_a_group_goes_through_intact(zmq_ctx):
    ctx, track = zmq_ctx
    receiver = track(GroupReceiver(ctx, ANY, hwm=4, max_bytes=MAX_BYTES, vocab_size=VOCAB))
    sender = track(GroupSender(ctx, bound(receiver.sock), hwm=4))
    g = make_group(version=2)
    assert sender.send(g, timeout_s=2.0)
    got = take(receiver)
    assert got is not None
    assert (got.prompt_id, got.policy_version, got.actor_id, got.samples, got.created_at) == \
        (g.prompt_id, g.policy_version, g.actor_id, g.samples, g.created_at)
    for name in ("prompt_tokens", "completion_tokens", "behaviour_logprobs"):
        assert np.array_equal(getattr(got, name), getattr(g, name))
    assert receiver.received == 1 and receiver.rejected.total == 0


def test_take_returns_none_when_nothing_waits(zmq_ctx):
    ctx, track = zmq_ctx
    receiver = track(GroupReceiver(ctx, ANY, hwm=4, max_bytes=MAX_BYTES, vocab_size=VOCAB))
    assert receiver.take() is None
    assert receiver.received == 0


def test_garbage_is_counted_by_reason_and_the_next_good_group_still_arrives(zmq_ctx):
    ctx, track = zmq_ctx
    receiver = track(GroupReceiver(ctx, ANY, hwm=100, max_bytes=MAX_BYTES, vocab_size=VOCAB))
    raw = _raw_pusher(ctx, track, receiver)
    good = codec.encode_groups([make_group()])
    garbage = [
        [b"\xc1\xc1\xc1"],                                            # bad_frame
        [b"not msgpack at all", b"x", b"y", b"z"],                    # bad_frame or bad_header
        [msgspec.msgpack.encode({"type": "nope", "schema": 1})],      # bad_header
        wire.encode(wire.Shutdown()),                                 # unexpected_type
        good[:2],                                                     # frame_count
        [*good, b"extra", b"more"],                                   # frame_count
        [*good, b"extra"],                                            # length_mismatch (a model-token mask)
        codec.encode_groups([make_group(tokens=(9, VOCAB, 11))]),         # token_out_of_range
        codec.encode_groups([make_group(version=-1)]),                    # bad_version
    ]
    for frames in garbage:
        raw.send_multipart(frames, copy=False)
    raw.send_multipart(codec.encode_groups([make_group(version=5)]), copy=False)
    got = take(receiver)  # one socket keeps order: every garbage message was taken before this
    assert got is not None and got.policy_version == 5
    counts = dict(receiver.rejected.counts)
    junk = counts.pop("bad_frame", 0) + counts.pop("bad_header", 0)
    assert junk == 3
    assert counts == {"unexpected_type": 1, "frame_count": 2, "length_mismatch": 1, "token_out_of_range": 1,
                      "bad_version": 1}
    assert receiver.rejected.total == len(garbage)
    assert receiver.received == 1


def test_a_group_from_a_peer_of_the_old_schema_is_counted_and_logged_with_both_versions_and_masked_ones_arrive(
        zmq_ctx, caplog):
    ctx, track = zmq_ctx
    receiver = track(GroupReceiver(ctx, ANY, hwm=100, max_bytes=MAX_BYTES, vocab_size=VOCAB))
    raw = _raw_pusher(ctx, track, receiver)
    old = [bytes(memoryview(f)) for f in codec.encode_groups([make_group()])]
    header = msgspec.msgpack.decode(old[0])
    header["schema"] = 1  # what a build from before model-token masks sends
    raw.send_multipart([msgspec.msgpack.encode(header), *old[1:]])
    masked = codec.ScoredGroup.from_samples(
        prompt_id="episode", policy_version=2, actor_id="a", prompt_tokens=[1, 2], completions=[[9, 10, 11]],
        logprobs=[[-0.5, -1.0, -2.0]], rewards=[1.0], finish_reasons=["stop"],
        model_token_masks=[np.array([True, False, True])])
    raw.send_multipart(codec.encode_groups([masked]), copy=False)
    got = take(receiver)
    assert got is not None and got.prompt_id == "episode"
    assert got.model_token_mask.tolist() == [True, False, True]
    assert dict(receiver.rejected.counts) == {"schema_version": 1}
    assert "GroupBatchHeader schema 1, this build speaks 2" in caplog.text


def test_sender_reports_backpressure_when_nobody_receives(zmq_ctx):
    ctx, track = zmq_ctx
    receiver = track(GroupReceiver(ctx, ANY, hwm=1, max_bytes=MAX_BYTES, vocab_size=VOCAB))
    sender = track(GroupSender(ctx, bound(receiver.sock), hwm=1))
    big = make_group(tokens=[9] * 100_000)  # ~800 kB: socket buffers fill after a few
    sent = 0
    deadline = time.monotonic() + 10
    while sender.send(big, timeout_s=0.2):
        sent += 1
        assert time.monotonic() < deadline, "a bounded queue never pushed back"
    assert sent >= 1
    assert sender.blocked_s >= 0.2


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(4, 3, generator=g), "b": torch.randn(3, generator=g).to(torch.bfloat16)}


def _weights_pair(ctx, track, actor_id="actor-0"):
    pub, pub_ctl = _learner(ctx, track, max_bytes=MAX_BYTES)
    sub = track(_subscriber(ctx, track, bound(pub.pub), bound(pub_ctl.sock), actor_id, MAX_BYTES))
    return pub, pub_ctl, sub


def _serving(control: ControlServer):
    """A wait_for `stop` hook that answers weight requests in this thread and never stops."""
    def stop() -> bool:
        control.serve()
        return False
    return stop


def test_a_late_joiner_gets_the_published_weights_through_the_request_path(zmq_ctx):
    ctx, track = zmq_ctx
    pub, pub_ctl = _learner(ctx, track, max_bytes=MAX_BYTES)
    state = _state(0)
    pub.publish(0, state)  # nobody is subscribed: the broadcast goes nowhere
    pub.flush()  # (the send runs on the publishing thread: done before anyone subscribes)
    sub = track(_subscriber(ctx, track, bound(pub.pub), bound(pub_ctl.sock), "late", MAX_BYTES))
    got = sub.wait_for(0, timeout_s=5.0, ask_every_s=0.2, stop=_serving(pub_ctl))
    assert got is not None
    version, tensors = got
    assert version == 0
    assert set(tensors) == {"w", "b"}
    for k, t in state.items():
        assert tensors[k].dtype == t.dtype and torch.equal(tensors[k], t)
    assert pub.requests_served >= 1


def test_wait_for_skips_versions_older_than_asked(zmq_ctx):
    ctx, track = zmq_ctx
    pub, pub_ctl, sub = _weights_pair(ctx, track)
    pub.publish(3, _state(3))
    got = sub.wait_for(3, timeout_s=5.0, ask_every_s=0.2, stop=_serving(pub_ctl))
    assert got is not None and got[0] == 3


def test_wait_for_times_out_with_a_clear_error_when_no_weights_exist(zmq_ctx):
    ctx, track = zmq_ctx
    pub, pub_ctl, sub = _weights_pair(ctx, track)
    with pytest.raises(TimeoutError, match="no weights with version >= 0"):
        sub.wait_for(0, timeout_s=0.3, ask_every_s=0.1, stop=_serving(pub_ctl))


def test_a_broadcast_reaches_a_connected_subscriber_and_poll_returns_the_newest(zmq_ctx):
    ctx, track = zmq_ctx
    pub, pub_ctl, sub = _weights_pair(ctx, track)
    # PUB/SUB joins late: publish until the subscription is live.
    got = None
    deadline = time.monotonic() + 5
    while got is None and time.monotonic() < deadline:
        pub.publish(0, _state(0))
        got = sub.poll(timeout_ms=50)
    assert got is not None and got[0] == 0
    for v in (1, 2, 3):
        pub.publish(v, _state(v))
    deadline = time.monotonic() + 10
    while sub._newest is None or sub._newest[0] < 3:  # all three in: the window where poll must choose
        assert time.monotonic() < deadline
        sub.watch(timeout_ms=50)
    newest = sub.poll()
    assert newest is not None and newest[0] == 3 and sub.poll() is None  # the newest, once; 1 and 2 superseded
    assert torch.equal(newest[1]["w"], _state(3)["w"])
    assert pub.requests_served == 0  # all by broadcast


def test_a_shutdown_sets_subscriber_shutdown_and_ends_wait_for(zmq_ctx):
    ctx, track = zmq_ctx
    pub, pub_ctl, sub = _weights_pair(ctx, track)
    deadline = time.monotonic() + 5
    while sub.inbox.shutdown is None and time.monotonic() < deadline:
        pub_ctl.shutdown("finished")
        sub.poll(timeout_ms=50)
    assert isinstance(sub.inbox.shutdown, wire.Shutdown)
    assert sub.inbox.shutdown.reason == "finished"
    assert sub.wait_for(10, timeout_s=5.0) is None


def test_an_actor_joining_during_shutdown_is_told_to_stop_instead_of_given_weights(zmq_ctx):
    ctx, track = zmq_ctx
    pub, pub_ctl = _learner(ctx, track, max_bytes=MAX_BYTES)
    pub.publish(5, _state(5))
    pub_ctl.shutdown("done")  # before the late actor exists: neither broadcast nor notice can reach it
    late = track(_subscriber(ctx, track, bound(pub.pub), bound(pub_ctl.sock), "late", MAX_BYTES))
    assert late.wait_for(0, timeout_s=5.0, ask_first=True, ask_every_s=0.2, stop=_serving(pub_ctl)) is None
    assert late.inbox.shutdown is not None and late.inbox.shutdown.reason == "done"


def test_a_restarted_learner_is_recognised_and_its_lower_version_taken(zmq_ctx):
    ctx, track = zmq_ctx
    first, first_ctl = _learner(ctx, track, max_bytes=MAX_BYTES)
    sub = track(_subscriber(ctx, track, bound(first.pub), bound(first_ctl.sock), "a", MAX_BYTES))
    first.publish(30, _state(30))
    assert sub.wait_for(30, timeout_s=5.0, ask_first=True, ask_every_s=0.2, stop=_serving(first_ctl))[0] == 30
    second, second_ctl = _learner(ctx, track)  # resumed from a checkpoint at 20
    second.publish(20, _state(20))
    sub.inbox.sock.connect(bound(second_ctl.sock))  # (a restarted learner binds the same addresses)
    sub.sub.connect(bound(second.pub))
    got = sub.wait_for(31, timeout_s=5.0, ask_first=True, ask_every_s=0.2, stop=_serving(second_ctl))
    assert got is not None and got[0] == 20 and sub.learner_restarts == 1 and sub.learner == second.session


def test_the_request_server_counts_bad_requests_and_answers_a_good_one_by_sending_the_version_again(zmq_ctx):
    ctx, track = zmq_ctx
    pub, pub_ctl = _learner(ctx, track, max_bytes=MAX_BYTES)
    pub.publish(1, _state(1))
    pub.flush()
    listener = track(ctx.socket(zmq.SUB))
    listener.setsockopt(zmq.LINGER, 0)
    listener.setsockopt(zmq.SUBSCRIBE, b"")
    listener.connect(bound(pub.pub))
    joined(pub.pub, listener)
    raw = track(ctx.socket(zmq.DEALER))
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(bound(pub_ctl.sock))
    raw.send_multipart([b"\xc1"])
    raw.send_multipart(wire.encode(wire.Shutdown()))
    raw.send_multipart(wire.encode(wire.WeightsRequest(actor_id="raw")))
    deadline = time.monotonic() + 5
    while pub.requests_served < 1 and time.monotonic() < deadline:
        pub_ctl.sock.poll(50)
        pub_ctl.serve()
    assert pub.requests_served == 1 and pub.rebroadcasts == 1
    assert dict(pub_ctl.rejected.counts) == {"bad_frame": 1, "unexpected_type": 1}
    assert listener.poll(2000)
    version, tensors = assembly.decode_weights([listener.recv_multipart()])
    assert version == 1 and torch.equal(tensors["w"], _state(1)["w"])


def test_after_settle_a_request_waits_for_the_next_version_instead_of_reading_changed_parameters(zmq_ctx):
    ctx, track = zmq_ctx
    pub, pub_ctl = _learner(ctx, track, max_bytes=MAX_BYTES)
    live = _state(1)
    pub.publish(1, live)
    pub.flush()  # sent before anyone subscribed
    pub.settle()  # the optimizer step follows: the parameters are no longer version 1
    live["w"].fill_(-7.0)
    sub = track(_subscriber(ctx, track, bound(pub.pub), bound(pub_ctl.sock), "late", MAX_BYTES))
    with pytest.raises(TimeoutError):
        sub.wait_for(1, timeout_s=1.0, ask_first=True, ask_every_s=0.2, stop=_serving(pub_ctl))
    assert pub.rebroadcasts == 0
    pub.publish(2, live, broadcast=False)  # the next version answers the waiting request
    got = sub.wait_for(2, timeout_s=5.0, ask_every_s=0.2, stop=_serving(pub_ctl))
    assert got[0] == 2 and got[1]["w"].unique().tolist() == [-7.0]


def _fake_learner(ctx, track):
    """A raw ROUTER the subscriber asks, and a PUB it listens to, both driven by the test."""
    router = track(ctx.socket(zmq.ROUTER))
    router.setsockopt(zmq.LINGER, 0)
    router.bind(ANY)
    pub = track(ctx.socket(zmq.PUB))
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(ANY)
    return router, pub


def _answer(router, sub, reply_frames):
    sub.request(-1)
    assert router.poll(2000)
    identity, *_ = router.recv_multipart()
    router.send_multipart([identity, *reply_frames])


def test_the_subscriber_counts_bad_weight_messages_and_takes_the_next_good_one(zmq_ctx):
    ctx, track = zmq_ctx
    router, pub = _fake_learner(ctx, track)
    sub = track(_subscriber(ctx, track, bound(pub), bound(router), "actor-0", MAX_BYTES))
    _answer(router, sub, [b"\xc1"])
    _answer(router, sub, chunks.encode_weights(0, {"w": torch.ones(2)})[0][:1])  # chunk frame missing
    _answer(router, sub, chunks.encode_weights(4, {"w": torch.ones(2)})[0])
    deadline = time.monotonic() + 5
    got = None
    while got is None and time.monotonic() < deadline:
        got = sub.poll(timeout_ms=50)
    assert got is not None and got[0] == 4
    assert dict(sub.rejected.counts) == {"bad_frame": 1, "frame_count": 1}


def test_a_weights_message_with_negative_dims_does_not_crash_the_subscriber(zmq_ctx):
    ctx, track = zmq_ctx
    router, pub = _fake_learner(ctx, track)
    sub = track(_subscriber(ctx, track, bound(pub), bound(router), "actor-0", MAX_BYTES))
    header = msgspec.msgpack.encode(wire.WeightsChunk(version=0, tensors=[wire.TensorInfo("w", "float32", [-2, -2])],
                                                      offsets=[0], total=16, chunk_bytes=64))
    _answer(router, sub, [header, bytes(16)])
    deadline = time.monotonic() + 5
    while sub.rejected.total == 0 and time.monotonic() < deadline:
        sub.poll(timeout_ms=50)
    assert sub.rejected.total == 1


def test_a_header_that_is_not_utf8_is_counted_not_raised(zmq_ctx):
    ctx, track = zmq_ctx
    receiver = track(GroupReceiver(ctx, ANY, hwm=4, max_bytes=MAX_BYTES, vocab_size=VOCAB))
    raw = _raw_pusher(ctx, track, receiver)
    raw.send_multipart([b"\x81\xa4type\xa2\xff\xfe"])
    raw.send_multipart(codec.encode_groups([make_group(version=1)]))
    got = take(receiver)
    assert got is not None and got.policy_version == 1
    assert receiver.rejected.total == 1


def test_a_demand_wakes_a_waiting_subscriber_once_and_only_for_its_version(zmq_ctx):
    ctx, track = zmq_ctx
    pub, pub_ctl = _learner(ctx, track, MAX_BYTES)
    sub = track(_subscriber(ctx, track, bound(pub.pub), bound(pub_ctl.sock), "actor-0", MAX_BYTES))
    pub.publish(3, {"w": torch.zeros(2)})
    assert sub.wait_for(3, timeout_s=10, ask_first=True, stop=_serving(pub_ctl))[0] == 3
    deadline = time.monotonic() + 5
    while not pub_ctl.peers:  # the broadcast may have beaten the reply; the learner knows the actor once it serves
        assert time.monotonic() < deadline
        pub_ctl.sock.poll(50)
        pub_ctl.serve()
    pub_ctl.demand(version=2, groups_missing=5)  # for a version this actor no longer holds
    pub_ctl.demand(version=3, groups_missing=4)
    t0 = time.monotonic()
    assert sub.wait_for(4, timeout_s=10) is None  # woken by the demand, not by new weights
    assert time.monotonic() - t0 < 5
    d = sub.inbox.take_demand(3)
    assert d is not None and d.groups_missing == 4
    assert sub.inbox.take_demand(3) is None


def test_weights_seen_while_watching_for_notices_are_kept_for_the_next_poll(zmq_ctx):
    ctx, track = zmq_ctx
    pub, pub_ctl, sub = _weights_pair(ctx, track)
    pub.publish(1, _state(1))
    assert sub.wait_for(1, timeout_s=5.0, ask_every_s=0.2, stop=_serving(pub_ctl))[0] == 1
    pub.publish(2, _state(2))
    deadline = time.monotonic() + 5
    while sub._newest is None and time.monotonic() < deadline:
        sub.watch(timeout_ms=50)  # what an actor does while the learner applies backpressure
    got = sub.poll()
    assert got is not None and got[0] == 2
    assert sub.poll() is None  # handed out once


def test_a_batch_message_yields_each_group_with_its_own_seq(zmq_ctx):
    ctx, track = zmq_ctx
    receiver = track(GroupReceiver(ctx, ANY, hwm=4, max_bytes=MAX_BYTES, vocab_size=VOCAB))
    sender = track(GroupSender(ctx, bound(receiver.sock), hwm=4, actor_id="actor-0", batch_max_bytes=1 << 16))
    assert sender.send(make_group(version=1), timeout_s=2.0)
    groups = [make_group(version=2, tokens=(9,) * (i + 1)) for i in range(5)]
    assert sender.send_batch(groups, timeout_s=2.0)
    assert sender.sent == 6
    got = [take(receiver) for _ in range(6)]
    assert [g.seq for g in got] == [0, 1, 2, 3, 4, 5]
    assert [g.completion_tokens.size for g in got[1:]] == [2, 3, 4, 5, 6]  # each its own slice
    assert {(g.actor_id, g.session) for g in got} == {("actor-0", sender.session)}
    assert receiver.received == 6 and receiver.rejected.total == 0
    assert receiver.sessions[("actor-0", sender.session)].received == 6


def test_groups_of_a_batch_count_as_received_only_when_taken_and_the_report_after_them(zmq_ctx):
    ctx, track = zmq_ctx
    receiver = track(GroupReceiver(ctx, ANY, hwm=4, max_bytes=MAX_BYTES, vocab_size=VOCAB))
    sender = track(GroupSender(ctx, bound(receiver.sock), hwm=4, actor_id="actor-0", batch_max_bytes=1 << 16))
    assert sender.send_batch([make_group() for _ in range(3)], timeout_s=2.0)
    assert sender.report(groups_generated=3, reason="done")
    assert take(receiver) is not None
    session = receiver.sessions[("actor-0", sender.session)]
    assert receiver.received == 1 and len(receiver.pending) == 2 and session.report is None
    assert take(receiver) is not None and take(receiver) is not None
    assert take(receiver, timeout_s=0.5) is None  # reads the report
    assert session.report is not None and session.report.groups_sent == session.received == 3


def test_a_malformed_batch_is_rejected_with_a_reason_and_counted_and_the_receiver_keeps_serving(zmq_ctx):
    ctx, track = zmq_ctx
    receiver = track(GroupReceiver(ctx, ANY, hwm=100, max_bytes=MAX_BYTES, vocab_size=VOCAB))
    raw = _raw_pusher(ctx, track, receiver)
    good = [make_group(version=v) for v in (1, 2, 3)]
    frames = codec.encode_groups(good)
    bad_token = [make_group(), make_group(tokens=(9, VOCAB))]
    garbage = [
        [frames[0], frames[1], frames[2][:-4], frames[3]],                                   # length_mismatch
        [frames[0], frames[1], frames[2]],                                                   # frame_count
        [msgspec.msgpack.encode(wire.GroupBatchHeader(actor_id="x", groups=[])), b"", b"", b""],  # empty_batch
        codec.encode_groups(bad_token),                                                       # token_out_of_range
    ]
    for f in garbage:
        raw.send_multipart(f, copy=False)
    raw.send_multipart(frames, copy=False)
    got = [take(receiver) for _ in range(3)]
    assert [g.policy_version for g in got if g is not None] == [1, 2, 3]
    assert dict(receiver.rejected.counts) == {"length_mismatch": 1, "frame_count": 1, "empty_batch": 1,
                                              "token_out_of_range": 1}
    assert receiver.received == 3  # a rejected batch gives none of its groups


def test_batches_keep_order_and_the_byte_cap_and_a_group_above_it_goes_alone(zmq_ctx):
    ctx, track = zmq_ctx
    small = [make_group(version=v) for v in range(5)]  # 2 prompt + 4 completion tokens + 4 log-probs: 40 bytes
    big = make_group(version=9, tokens=(9,) * 100)
    assert codec.group_nbytes(small[0]) == 40
    sender = track(GroupSender(ctx, "tcp://127.0.0.1:1", hwm=1, batch_max_bytes=100))
    groups = [*small[:2], big, *small[2:]]
    batches = sender.batches(groups)
    assert [[g.policy_version for g in b] for b in batches] == [[0, 1], [9], [2, 3], [4]]
    sender.batch_max_bytes = 0  # never batch
    assert [len(b) for b in sender.batches(groups)] == [1] * 6


def test_a_batch_refused_by_backpressure_uses_up_no_seq(zmq_ctx):
    ctx, track = zmq_ctx
    receiver = track(GroupReceiver(ctx, ANY, hwm=1, max_bytes=MAX_BYTES, vocab_size=VOCAB))
    sender = track(GroupSender(ctx, bound(receiver.sock), hwm=1, batch_max_bytes=1 << 30))
    batch = [make_group(tokens=[9] * 50_000) for _ in range(4)]
    deadline = time.monotonic() + 10
    while sender.send_batch(batch, timeout_s=0.2):
        assert time.monotonic() < deadline, "a bounded queue never pushed back"
    sent = sender.sent
    assert sent % 4 == 0 and [g.seq for g in batch] == list(range(sent, sent + 4))
    while (g := take(receiver, timeout_s=1.0)) is not None:
        last = g.seq
    assert last == sent - 1 and receiver.received == sent


@pytest.mark.parametrize("background", [False, True], ids=["copied-in-publish", "copied-in-background"])
def test_an_actor_gets_exactly_the_published_weights_though_training_changes_them_right_after(zmq_ctx, background):
    ctx, track = zmq_ctx
    pub, pub_ctl, sub = _weights_pair(ctx, track)
    live = {"w": torch.zeros(200, 1024), "b": torch.zeros(3)}  # 800 KB: sent from memory, a copy long enough to race
    got = None
    deadline = time.monotonic() + 5
    while got is None and time.monotonic() < deadline:  # PUB/SUB joins late
        pub.publish(0, live)
        got = sub.poll(timeout_ms=50)
    seen = {}
    for v in range(1, 21):
        live["w"].fill_(float(v))
        live["b"].fill_(float(v))
        pub.publish(v, live, wait=not background)  # background: returns before the copy (forward/backward runs)
        pub.settle()  # what the engine does right before the optimizer step (a no-op after wait=True)
        live["w"].fill_(-1.0)  # the optimizer step that follows, in place
        live["b"].fill_(-1.0)
        while (got := sub.poll(timeout_ms=0)) is not None:
            seen[got[0]] = [(t.min().item(), t.max().item()) for t in got[1].values()]
    # Sends wait for the pool, so no version is dropped at the high-water mark: the newest comes by broadcast.
    deadline = time.monotonic() + 5
    while 20 not in seen and time.monotonic() < deadline:
        if (got := sub.poll(timeout_ms=50)) is not None:
            seen[got[0]] = [(t.min().item(), t.max().item()) for t in got[1].values()]
    assert 20 in seen and len(seen) >= 2
    assert all(ranges == [(v, v), (v, v)] for v, ranges in seen.items())
    live["w"].fill_(21.0)
    pub.publish(21, live, wait=not background)
    late = track(_subscriber(ctx, track, bound(pub.pub), bound(pub_ctl.sock), "late", MAX_BYTES))
    version, tensors = late.wait_for(21, timeout_s=5.0, ask_first=True, ask_every_s=0.2, stop=_serving(pub_ctl))
    assert version == 21 and (tensors["w"].min(), tensors["w"].max()) == (21.0, 21.0)  # sent again from `live`


def _announce_until_seen(pub: WeightPublisher, pub_ctl: ControlServer, sub: WeightSubscriber, version: int
                         ) -> tuple[int, dict] | None:
    """Announce `version` over PUB until the subscription is live; the answer may come via the ROUTER."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        pub.announce(wire.WeightsCollective(version=version, buckets=[], learner=pub.session))
        pub_ctl.serve()
        got = sub.poll(timeout_ms=50)
        if got is not None and got[0] == version:
            return got
    return None


def test_a_collective_announcement_is_answered_by_the_group_and_a_failed_group_falls_back_to_the_router(zmq_ctx):
    ctx, track = zmq_ctx
    pub, pub_ctl = _learner(ctx, track, max_bytes=MAX_BYTES)
    pub.publish(0, _state(0))
    from_group = {"w": torch.zeros(4, 3), "b": torch.zeros(3, dtype=torch.bfloat16)}
    joined = []
    sub = track(_subscriber(ctx, track, bound(pub.pub), bound(pub_ctl.sock), "actor-0", MAX_BYTES,
                                 collective=lambda msg: joined.append(msg.version) or from_group))
    assert sub.wait_for(0, timeout_s=5.0, ask_every_s=0.2, stop=_serving(pub_ctl))[0] == 0  # learns the session
    pub.publish(1, _state(1), broadcast=False)  # kept for requests only: the group carries it
    got = _announce_until_seen(pub, pub_ctl, sub, 1)
    assert got is not None and got[1] is from_group and joined[-1] == 1
    sub.collective = lambda msg: None  # the group failed on this actor's side
    pub.publish(2, _state(2), broadcast=False)
    got = _announce_until_seen(pub, pub_ctl, sub, 2)
    assert got is not None and torch.equal(got[1]["w"], _state(2)["w"])  # the same version, from the ROUTER
    assert sub.collective is None  # and the collective is left for good


def test_a_request_during_a_background_publish_gets_that_version_once_its_copy_is_complete(zmq_ctx):
    ctx, track = zmq_ctx
    pub, pub_ctl, sub = _weights_pair(ctx, track)
    pub.publish(1, {"w": torch.full((1 << 16,), 1.0)})
    live = {"w": torch.full((1 << 16,), 2.0)}
    pub.publish(2, live, wait=False)
    sub.request(have_version=1)
    got = sub.wait_for(2, timeout_s=5.0, ask_every_s=5.0, stop=_serving(pub_ctl))  # no second ask needed
    pub.settle()
    live["w"].fill_(-1.0)  # settled: changing the parameters now tears nothing
    assert got[0] == 2 and got[1]["w"].unique().tolist() == [2.0]


def test_a_failed_background_copy_is_raised_by_settle(zmq_ctx, monkeypatch):
    ctx, track = zmq_ctx
    pub, pub_ctl = _learner(ctx, track, max_bytes=MAX_BYTES)
    copy = chunks.copy_chunk

    def broken(*args):
        raise RuntimeError("device lost")

    monkeypatch.setattr(chunks, "copy_chunk", broken)
    pub.publish(0, {"w": torch.ones(2, 2).t()}, wait=False)  # not contiguous: copied into the pool
    with pytest.raises(RuntimeError, match="device lost"):
        pub.settle()
    pub.settle()  # raised once, then the publisher is usable again
    monkeypatch.setattr(chunks, "copy_chunk", copy)
    pub.publish(1, {"w": torch.ones(2)})
    assert pub.version == 1 and pub.latest is not None


def test_a_version_larger_than_the_message_cap_arrives_whole_in_place_or_through_a_bounded_chunk_pool(zmq_ctx):
    ctx, track = zmq_ctx
    pub, pub_ctl = _learner(ctx, track, max_bytes=MAX_BYTES, pool_chunks=2)
    sub = track(_subscriber(ctx, track, bound(pub.pub), bound(pub_ctl.sock), "actor-0", MAX_BYTES))
    g = torch.Generator().manual_seed(0)
    live = {"a": torch.randn(300, 1024, generator=g), "b": torch.randn(7, generator=g).to(torch.bfloat16),
            "c": torch.randn(500, 1000, generator=g)}  # ~3.2 MB over a 1 MiB cap, sent from their own memory
    pub.publish(0, live)
    got = sub.wait_for(0, timeout_s=10.0, ask_first=True, ask_every_s=0.5, stop=_serving(pub_ctl))
    assert all(torch.equal(got[1][k], t) for k, t in live.items())
    assert pub.chunk_bytes < MAX_BYTES and -(-sum(t.nbytes for t in live.values()) // pub.chunk_bytes) >= 4
    assert pub.pool.buffers == [] and pub.copy_s == 0  # nothing copied on the learner
    # A tensor inside one frame arrives as a view of it; only those cut by a chunk boundary are copied.
    assert got[1]["b"].data_ptr() != 0 and not got[1]["b"].untyped_storage().resizable()
    transposed = {k: t.t() if t.dim() == 2 else t for k, t in live.items()}  # not contiguous: through the pool
    pub.publish(1, transposed)
    got = sub.wait_for(1, timeout_s=10.0, ask_every_s=0.5, stop=_serving(pub_ctl))
    assert all(torch.equal(got[1][k], t) for k, t in transposed.items())
    assert len(pub.pool.buffers) == 2 and all(b.numel() <= pub.chunk_bytes for b in pub.pool.buffers)
    assert sub.rejected.total == 0


def _chunks(version: int, value: float, learner: str = "L") -> list:
    return chunks.encode_weights(version, {"w": torch.full((1024,), value)}, learner=learner, chunk_bytes=1024)


def test_a_version_with_a_lost_chunk_is_dropped_and_counted_and_the_next_complete_one_delivered(zmq_ctx):
    ctx, track = zmq_ctx
    router, pub = _fake_learner(ctx, track)
    sub = track(_subscriber(ctx, track, bound(pub), bound(router), "actor-0", MAX_BYTES))
    v1, v2 = _chunks(1, 1.0), _chunks(2, 2.0)
    for m in v1[:2] + v1[3:]:  # chunk 2 of 4 lost
        _answer(router, sub, m)
    assert sub.poll(timeout_ms=300) is None
    for m in v2[::-1]:  # any order
        _answer(router, sub, m)
    got = None
    deadline = time.monotonic() + 5
    while got is None and time.monotonic() < deadline:
        got = sub.poll(timeout_ms=50)
    assert got[0] == 2 and got[1]["w"].unique().tolist() == [2.0]
    assert dict(sub.rejected.counts) == {"chunk_lost": 1}


def test_duplicate_and_mismatched_chunks_are_counted_and_the_version_still_arrives_intact(zmq_ctx):
    ctx, track = zmq_ctx
    router, pub = _fake_learner(ctx, track)
    sub = track(_subscriber(ctx, track, bound(pub), bound(router), "actor-0", MAX_BYTES))
    v1 = _chunks(1, 1.0)
    other = chunks.encode_weights(1, {"x": torch.zeros(1024)}, learner="L", chunk_bytes=1024)  # another layout
    for m in [v1[0], v1[1], v1[1], other[2], v1[2], v1[3]]:
        _answer(router, sub, m)
    got = None
    deadline = time.monotonic() + 5
    while got is None and time.monotonic() < deadline:
        got = sub.poll(timeout_ms=50)
    assert got[0] == 1 and got[1]["w"].unique().tolist() == [1.0]
    assert dict(sub.rejected.counts) == {"duplicate_chunk": 1, "chunk_mismatch": 1}
    for m in v1:  # the same version again (sent for another subscriber): skipped, not counted
        _answer(router, sub, m)
    assert sub.poll(timeout_ms=300) is None and sub.rejected.total == 2


def test_a_subscriber_that_reads_late_gets_every_chunk_however_many_are_in_flight(zmq_ctx):
    ctx, track = zmq_ctx
    pub, pub_ctl = _learner(ctx, track, max_bytes=MAX_BYTES, pool_chunks=32)
    pub.pub.setsockopt(zmq.SNDBUF, 4096)  # (for connections made from here on)
    late = track(ctx.socket(zmq.SUB))  # takes nothing for a while: the chunks wait in the publisher's queue
    late.setsockopt(zmq.RCVHWM, 1)
    late.setsockopt(zmq.RCVBUF, 4096)
    late.setsockopt(zmq.SUBSCRIBE, b"")
    late.connect(bound(pub.pub))
    joined(pub.pub, late)
    live = {"w": torch.arange(12 << 20, dtype=torch.float32)}  # 48 MB: 64 chunks, 32 of them in flight at a time
    pub.publish(1, live, wait=False)
    time.sleep(1.0)
    messages = []
    while late.poll(5000):
        messages.append(late.recv_multipart())
        if len(messages) == 64:
            break
    version, back = assembly.decode_weights(messages)  # chunk_lost if the socket dropped one
    assert version == 1 and torch.equal(back["w"], live["w"])
    pub.settle()


def test_a_subscriber_that_stops_reading_cannot_hold_the_learner_or_see_parameters_change_mid_send(zmq_ctx):
    ctx, track = zmq_ctx
    pub, pub_ctl = _learner(ctx, track, max_bytes=MAX_BYTES, pool_chunks=2, stall_s=0.5)
    stuck = track(ctx.socket(zmq.SUB))  # connected, subscribed, never reads: its queues fill and stay full
    stuck.setsockopt(zmq.RCVHWM, 1)
    stuck.setsockopt(zmq.RCVBUF, 4096)
    pub.pub.setsockopt(zmq.SNDBUF, 4096)
    stuck.setsockopt(zmq.SUBSCRIBE, b"")
    stuck.connect(bound(pub.pub))
    sub = track(_subscriber(ctx, track, bound(pub.pub), bound(pub_ctl.sock), "actor-0", MAX_BYTES))
    live = {"w": torch.full((2 << 20,), 1.0)}  # 8 MB, sent from its own memory in 11 chunks
    joined(pub.pub, stuck, sub.sub)  # both subscriptions in place (the stuck one reads nothing from here on)
    t0 = time.monotonic()
    pub.publish(1, live)  # returns only once no frame still reads `live`
    print("publish", time.monotonic() - t0, pub.reopened, pub.send_wait_s)
    assert time.monotonic() - t0 < 30 and pub.reopened >= 1  # the stalled chunks were dropped, not waited for
    pub.settle()
    live["w"].fill_(-1.0)  # what the optimizer step does: no subscriber may ever see a -1 in version 1
    pub.publish(2, live)
    got = sub.wait_for(1, timeout_s=20.0, ask_first=True, ask_every_s=0.5, stop=_serving(pub_ctl))
    assert (got[0], got[1]["w"].unique().tolist()) in ((1, [1.0]), (2, [-1.0]))


def test_episode_counts_ride_on_the_groups_into_the_sessions_count_until_its_report_holds_the_total(zmq_ctx):
    from streamrl.actors.generation import carry_counts

    ctx, track = zmq_ctx
    receiver = track(GroupReceiver(ctx, ANY, hwm=4, max_bytes=MAX_BYTES, vocab_size=VOCAB))
    sender = track(GroupSender(ctx, bound(receiver.sock), hwm=4, actor_id="actor-0"))  # make_group's
    assert carry_counts([], "episode_counts", {"episodes": 2}, {}) == {"episodes": 2}  # no group made: kept
    for unsent in ({"episodes": 2}, {}):
        g = make_group()
        assert carry_counts([g], "episode_counts", {"episodes": 4, "tool_calls/add/ok": 3}, unsent) == {}
        assert sender.send(g, timeout_s=5.0)
        assert take(receiver).episode_counts == {"episodes": 4 + unsent.get("episodes", 0), "tool_calls/add/ok": 3}
    [count] = receiver.sessions.values()
    assert count.episode_count_totals == {"episodes": 10, "tool_calls/add/ok": 6}
    assert sender.report(2, "stopped", episode_counts={"episodes": 12, "tool_calls/add/ok": 6})
    deadline = time.monotonic() + 10
    while count.report is None and time.monotonic() < deadline:
        receiver.take()
        time.sleep(0.01)
    assert count.episode_count_totals == {"episodes": 12, "tool_calls/add/ok": 6}  # the report's total wins
