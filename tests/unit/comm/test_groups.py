"""streamrl.comm.groups over loopback TCP in one process: groups and batches arrive intact and in order, bad frames are
rejected by reason and counted, backpressure, seq numbers, and the episode counts that ride on the groups."""

from __future__ import annotations

import time

import msgspec
import numpy as np
import pytest
import zmq
from fakes.pubsub import bound

from streamrl.comm import codec, wire
from streamrl.comm.groups import GroupReceiver, GroupSender

pytestmark = pytest.mark.timeout(30)

ANY = "tcp://127.0.0.1:*"  # the OS picks a free port; LAST_ENDPOINT tells which
VOCAB = 32
MAX_BYTES = 1 << 20


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


def test_a_header_that_is_not_utf8_is_counted_not_raised(zmq_ctx):
    ctx, track = zmq_ctx
    receiver = track(GroupReceiver(ctx, ANY, hwm=4, max_bytes=MAX_BYTES, vocab_size=VOCAB))
    raw = _raw_pusher(ctx, track, receiver)
    raw.send_multipart([b"\x81\xa4type\xa2\xff\xfe"])
    raw.send_multipart(codec.encode_groups([make_group(version=1)]))
    got = take(receiver)
    assert got is not None and got.policy_version == 1
    assert receiver.rejected.total == 1


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
