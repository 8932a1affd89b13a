"""streamrl.comm.weights over loopback TCP in one process: the publisher and subscriber with the requests, demand
and shutdown they share with the control channel (late joiners, re-broadcasts, settle, chunks lost or damaged,
stalled subscribers)."""

from __future__ import annotations

import threading
import time

import msgspec
import pytest
import torch
import zmq
from fakes.pubsub import bound, joined

from streamrl.comm import wire
from streamrl.comm.control import ControlServer, Inbox
from streamrl.comm.weights import assembly, chunks, encoders
from streamrl.comm.weights.publisher import WeightPublisher
from streamrl.comm.weights.subscriber import WeightSubscriber

pytestmark = pytest.mark.timeout(30)

ANY = "tcp://127.0.0.1:*"  # the OS picks a free port; LAST_ENDPOINT tells which
MAX_BYTES = 1 << 20


def _learner(ctx, track, max_bytes: int = MAX_BYTES, **kw) -> tuple[WeightPublisher, ControlServer]:
    """The learner's weight publisher and the control server that answers requests through it."""
    pub = track(WeightPublisher(ctx, ANY, max_bytes=max_bytes, **kw))
    return pub, track(ControlServer(ctx, ANY, pub))


def _subscriber(ctx, track, pub_addr: str, router_addr: str, actor_id: str, max_bytes: int, **kw) -> WeightSubscriber:
    """An actor's weight subscriber, with the control inbox it asks for weights through."""
    return WeightSubscriber(ctx, pub_addr, track(Inbox(ctx, router_addr, actor_id, max_bytes)), max_bytes, **kw)


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


def test_the_publisher_sends_through_any_encoder_it_is_given_without_asking_which(zmq_ctx):
    """The encoder interface is all the publisher knows: one of the test's own carries new versions and re-broadcasts,
    and what it sends arrives."""

    class Recording(encoders.FullEncoder):
        def __init__(self):
            self.jobs: list[tuple[int, bool]] = []

        def job(self, link, version, state, layout, copied, fresh, asked_have):
            self.jobs.append((version, fresh))
            return super().job(link, version, state, layout, copied, fresh, asked_have)

    ctx, track = zmq_ctx
    encoder = Recording()
    pub, pub_ctl = _learner(ctx, track, max_bytes=MAX_BYTES, encoder=encoder)
    state = _state(0)
    pub.publish(0, state)  # nobody is subscribed yet: only a request brings it
    pub.flush()
    sub = track(_subscriber(ctx, track, bound(pub.pub), bound(pub_ctl.sock), "late", MAX_BYTES))
    got = sub.wait_for(0, timeout_s=5.0, ask_every_s=0.2, stop=_serving(pub_ctl))
    assert got is not None and all(torch.equal(got[1][k], t) for k, t in state.items())
    assert encoder.jobs[0] == (0, True) and (0, False) in encoder.jobs[1:]  # the new version, then a re-broadcast
    assert pub.report() == {}


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
                                 sync=lambda msg: joined.append(msg.version) or from_group))
    assert sub.wait_for(0, timeout_s=5.0, ask_every_s=0.2, stop=_serving(pub_ctl))[0] == 0  # learns the session
    pub.publish(1, _state(1), broadcast=False)  # kept for requests only: the group carries it
    got = _announce_until_seen(pub, pub_ctl, sub, 1)
    assert got is not None and got[1] is from_group and joined[-1] == 1
    sub.sync = lambda msg: None  # the group failed on this actor's side
    pub.publish(2, _state(2), broadcast=False)
    got = _announce_until_seen(pub, pub_ctl, sub, 2)
    assert got is not None and torch.equal(got[1]["w"], _state(2)["w"])  # the same version, from the ROUTER
    assert sub.sync is None  # and the collective is left for good


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


def test_weights_copied_to_host_memory_free_the_learner_before_a_subscriber_reads_and_skip_versions_up_to_a_bound(
        zmq_ctx):
    """A host copy: `settle` waits for the copy, not the network, so the optimizer changes the parameters while a
    subscriber that has read nothing yet still gets the version as published; versions whose copy could not begin
    (the one before still on its way) are skipped, up to `run_ahead` past the one being sent; the next waits for it."""
    ctx, track = zmq_ctx
    pub, _ = _learner(ctx, track, max_bytes=MAX_BYTES, host_copy=2)
    assert isinstance(pub.encoder, encoders.HostCopyEncoder) and pub.encoder.detached and pub.encoder.run_ahead == 2
    pub.pub.setsockopt(zmq.SNDBUF, 4096)  # (for connections made from here on)
    late = track(ctx.socket(zmq.SUB))  # reads nothing until the learner has moved on: the chunks wait in the queue
    late.setsockopt(zmq.RCVHWM, 1)
    late.setsockopt(zmq.RCVBUF, 4096)
    late.setsockopt(zmq.SUBSCRIBE, b"")
    late.connect(bound(pub.pub))
    joined(pub.pub, late)
    live = {"w": torch.arange(3 << 20, dtype=torch.float32), "b": torch.ones(5, dtype=torch.bfloat16)}  # 12 MB
    per_version = -(-chunks.Layout(live).total // pub.chunk_bytes)
    published, got = {}, {}

    def step(v: int) -> None:
        pub.publish(v, live, wait=False)
        pub.settle()  # before the optimizer step: with the sends held up, it skips the version or waits
        published[v] = {k: t.clone() for k, t in live.items()}
        for t in live.values():
            t.add_(1)  # the optimizer step, in place

    def read(versions: int) -> None:
        for _ in range(versions):
            messages = []
            while len(messages) < per_version and late.poll(10000):
                messages.append(late.recv_multipart())
            version, tensors = assembly.decode_weights(messages)  # chunk_lost if one was dropped
            got[version] = tensors

    for v in (1, 2, 3):
        step(v)
    assert pub.skipped == 2 and pub.reopened == 0  # 2 and 3 were queued behind 1's send; nothing was given up
    reader = threading.Thread(target=read, args=(2,))
    reader.start()
    step(4)  # 3 versions past the one on its way, more than run_ahead: it waits for that send, then goes out
    reader.join(30)
    assert pub.skipped == 2 and sorted(got) == [1, 4]
    assert all(torch.equal(got[v][k], published[v][k]) for v in got for k in live)  # not the changed parameters
    assert pub.report()["weights_versions_skipped"] == 2 and pub.report()["weights_host_copy_s"] > 0
