"""Delta weight versions (transport.weights_delta, streamrl.comm.weights.encoders) over real ZeroMQ sockets on
loopback: versions assembled from deltas are bit-identical to full sends, a corrupted delta is caught by its checksum
and repaired by a full version, a full version damaged on the way is caught by its chunks' checksums and sent again,
and `auto` picks the smaller of the two."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import zmq
from fakes.pubsub import joined

from streamrl.comm import wire
from streamrl.comm.control import ControlServer, Inbox
from streamrl.comm.sockets import endpoint
from streamrl.comm.weights import assembly, chunks, encoders
from streamrl.comm.weights.publisher import WeightPublisher
from streamrl.comm.weights.subscriber import WeightSubscriber
from streamrl.commands.launch import free_ports

pytestmark = pytest.mark.timeout(120)



@pytest.fixture
def channel():
    """(publisher, control server, subscriber) on loopback, the subscription made live."""
    ctx = zmq.Context()
    opened = []

    def make(chunk_bytes: int = 4096, mode: str = "on", full_every: int = 1000):
        pub_port, req_port = free_ports(2)
        pub = WeightPublisher(ctx, endpoint("127.0.0.1", pub_port), 1 << 30, chunk_bytes=chunk_bytes,
                              delta_mode=mode, full_every=full_every)
        control = ControlServer(ctx, endpoint("127.0.0.1", req_port), pub)
        inbox = Inbox(ctx, endpoint("127.0.0.1", req_port), "actor-0", 1 << 30)
        sub = WeightSubscriber(ctx, endpoint("127.0.0.1", pub_port), inbox, 1 << 30, keep_base=True)
        opened.extend([sub, inbox, control, pub])
        joined(pub.pub, sub.sub)
        return pub, control, sub

    yield make
    for s in opened:
        s.close()
    ctx.destroy(linger=0)


def receive(sub: WeightSubscriber, version: int, control: ControlServer | None = None, timeout_s: float = 30.0):
    got = sub.wait_for(version, timeout_s, stop=(lambda: control.serve() < 0) if control else (lambda: False))
    assert got is not None and got[0] == version, got and got[0]
    return got[1]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def random_state(g: torch.Generator, dtype) -> dict:
    """Tensors of odd sizes (padding between them) and one cut by several 4 KiB chunks."""
    shapes = [(37, 29), (5,), (61, 17), (1,), (300, 11)]
    return {f"t{i}": torch.randn(s, generator=g).to(dtype) for i, s in enumerate(shapes)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_versions_assembled_from_random_sparse_deltas_are_bit_identical_to_full_sends(channel, dtype, seed):
    pub, _, sub = channel()
    g = torch.Generator().manual_seed(seed)
    state = random_state(g, dtype)
    for version in range(6):
        if version:
            pub.settle()
            for t in state.values():  # a small step on a random few per cent of the elements
                flat = t.view(-1)
                idx = torch.randperm(flat.numel(), generator=g)[:max(1, flat.numel() * (1 + version) // 100)]
                flat[idx] = (flat[idx].float() * (1 + 1e-2 * torch.randn(len(idx), generator=g))).to(dtype)
        pub.publish(version, state)
        pub.flush()
        got = receive(sub, version)
        _, full = assembly.decode_weights(chunks.encode_weights(version, state, chunk_bytes=4096))
        for name, t in state.items():
            assert torch.equal(bits(got[name]), bits(t)), name
            assert torch.equal(bits(got[name]), bits(full[name])), name
    assert (sub.fulls, sub.deltas) == (1, 5)
    report = pub.report()
    assert report["weights_delta_versions"] == 5
    assert report["weights_delta_bytes_per_version"] < report["weights_full_bytes_per_version"] / 2
    assert dict(sub.rejected.counts) == {}


@pytest.mark.parametrize("corrupt", ["actor_base", "payload"])
def test_a_corrupted_delta_is_refused_and_repaired_by_a_full_version(channel, corrupt):
    pub, control, sub = channel()
    state = {"w": torch.arange(4096, dtype=torch.float32).view(64, 64), "b": torch.ones(7)}
    pub.publish(0, state)
    receive(sub, 0)
    if corrupt == "actor_base":  # the actor's copy of version 0 lost a bit
        learner, version, payloads = sub._base
        bad = bytearray(b"".join(bytes(p) for p in payloads[0]))
        bad[100] ^= 0x10
        sub._base = (learner, version, [[memoryview(bytes(bad))]] + payloads[1:])
    else:  # a byte of the compressed delta flipped on the way
        send = pub.send_chunk

        def flip(header, frames):
            frames = [bytes(f) for f in frames]
            frames[-1] = frames[-1][:20] + bytes([frames[-1][20] ^ 0xFF]) + frames[-1][21:]
            pub.send_chunk = send
            return send(header, frames)

        pub.send_chunk = flip
    pub.settle()
    state["w"][3, :5] += 1.0
    pub.publish(1, state)
    got = receive(sub, 1, control)  # the bad delta is dropped; the request it made brings version 1 in full
    assert torch.equal(got["w"], state["w"]) and torch.equal(got["b"], state["b"])
    rejected = dict(sub.rejected.counts)
    assert set(rejected) <= {"delta_checksum", "delta_corrupt"} and sum(rejected.values()) >= 1, rejected
    assert pub.rebroadcasts >= 1
    pub.settle()
    state["w"][5, :5] -= 1.0
    pub.publish(2, state)  # repaired: the next delta applies on the full version's bytes
    got = receive(sub, 2, control)
    assert torch.equal(got["w"], state["w"]) and sub.deltas >= 1


@pytest.mark.parametrize("mode", ["off", "on"])
def test_a_flipped_bit_in_a_full_version_is_refused_counted_asked_for_again_and_the_right_version_applied(channel,
                                                                                                          mode):
    pub, control, sub = channel(mode=mode)  # on: a delta run's full versions (the first one) are checked alike
    state = {"w": torch.arange(4096, dtype=torch.float32).view(64, 64), "b": torch.ones(7)}
    send, flipped = pub.send_chunk, []

    def flip(header, frames):  # one bit of chunk 1 of version 0 flips on the way, once
        if not flipped and wire.decode_header([header]).index == 1:
            frames = [bytearray(memoryview(f).cast("B")) for f in frames]
            frames[0][17] ^= 0x04
            flipped.append(True)
        return send(header, frames)

    pub.send_chunk = flip
    pub.publish(0, state)  # live: the re-request is answered with version 0 again
    got = receive(sub, 0, control)
    assert flipped and torch.equal(got["w"], state["w"]) and torch.equal(got["b"], state["b"])
    assert dict(sub.rejected.counts) == {"weights_checksum": 1} and pub.rebroadcasts >= 1
    pub.settle()
    state["w"][1, :3] += 1.0
    pub.publish(1, state)  # the channel goes on as before (a delta from the version re-sent, in mode on)
    got = receive(sub, 1, control)
    assert torch.equal(got["w"], state["w"]) and dict(sub.rejected.counts) == {"weights_checksum": 1}


def test_a_delta_from_a_base_the_actor_lacks_is_refused_and_the_next_version_goes_full():
    ctx = zmq.Context()
    try:
        pub_port, req_port = free_ports(2)
        pub = WeightPublisher(ctx, endpoint("127.0.0.1", pub_port), 1 << 30, delta_mode="on")
        state = {"w": torch.zeros(256)}
        pub.publish(0, state)
        pub.settle()
        state["w"][0] = 1.0
        pub.publish(1, state)  # a delta from version 0
        pub.settle()
        assert pub.encoder.stats["delta"][0] == 1
        pub.ask(0)  # an actor holding version 0 asks while version 1 is already out
        state["w"][1] = 1.0
        pub.publish(2, state)  # a delta from 1 would not help it: version 2 goes full
        pub.flush()
        assert pub.encoder.stats == {"full": [2, 2 * 1024], "delta": pub.encoder.stats["delta"]}
        pub.close()
    finally:
        ctx.destroy(linger=0)


def test_an_actor_that_joins_between_deltas_drops_them_unrefused_and_starts_from_a_full_version(channel):
    """A subscriber holding no version yet sees the deltas broadcast before the full version it asked for: they
    were never its to apply (PUB/SUB cannot keep them from it), so they are not refused; it asks, and the learner
    answers with the version in full (a healthy run's joining actor logged a `delta_base` refusal)."""
    pub, control, sub = channel()
    state = {"w": torch.arange(4096, dtype=torch.float32).view(64, 64), "b": torch.ones(7)}
    pub.publish(0, state)
    pub.flush()
    while sub.sub.poll(1000):  # version 0 went by before this actor joined
        sub.sub.recv_multipart()
    pub.settle()
    state["w"][3, :5] += 1.0
    pub.publish(1, state)  # a delta from version 0, which this actor never held
    got = receive(sub, 1, control)
    assert torch.equal(got["w"], state["w"]) and pub.encoder.stats["delta"][0] == 1 and pub.rebroadcasts >= 1
    assert dict(sub.rejected.counts) == {} and (sub.fulls, sub.deltas) == (1, 0)
    pub.settle()
    state["w"][5, :5] -= 1.0
    pub.publish(2, state)  # from here on its deltas apply
    got = receive(sub, 2, control)
    assert torch.equal(got["w"], state["w"]) and sub.deltas == 1 and dict(sub.rejected.counts) == {}


def test_a_request_never_claims_a_newer_version_than_the_delta_base_held(channel):
    """`wait_for(v)` asks as holding v - 1; the learner must not take that for the base of its next delta."""
    pub, control, sub = channel()
    state = {"w": torch.zeros(256)}
    pub.publish(0, state)
    receive(sub, 0)
    pub.settle()  # no version live: the request waits for the next publish
    sub.request(5)
    for _ in range(500):
        control.serve()
        if pub._asked:
            break
        sub.watch(10)
    assert pub._asked == 1 and pub._asked_have == 0


def test_auto_sends_a_delta_only_when_it_is_smaller_and_a_full_version_every_n():
    layout_state = {"w": torch.randn(4096, generator=torch.Generator().manual_seed(0))}
    layout = chunks.Layout(layout_state)
    enc = encoders.DeltaEncoder("auto", full_every=3)
    values = list(layout_state.values())
    kinds = [enc.encode(0, layout, values, 1 << 20, "l")[0]]
    values[0][:10] += 1.0  # sparse: the delta is far smaller
    kinds.append(enc.encode(1, layout, values, 1 << 20, "l")[0])
    noise = torch.randint(-2**31, 2**31 - 1, (4096,), dtype=torch.int32, generator=torch.Generator().manual_seed(1))
    values[0].view(torch.int32).copy_(noise)  # every bit random: its XOR does not compress
    kinds.append(enc.encode(2, layout, values, 1 << 20, "l")[0])
    values[0][:10] += 1.0
    kinds.append(enc.encode(3, layout, values, 1 << 20, "l")[0])
    values[0][:10] += 1.0
    kinds.append(enc.encode(4, layout, values, 1 << 20, "l")[0])
    values[0][:10] += 1.0
    kinds.append(enc.encode(5, layout, values, 1 << 20, "l")[0])  # third since the last full one
    assert kinds == ["full", "delta", "full", "delta", "delta", "full"]
    assert np.array_equal(enc.base, chunks.encode_weights(5, layout_state)[0][1])


def test_delta_apply_names_what_is_wrong():
    layout = chunks.Layout({"w": torch.zeros(64)})
    enc = encoders.DeltaEncoder("on", full_every=100)
    w = torch.zeros(64)
    enc.encode(0, layout, [w], 1 << 20, "l")
    w[3] = 2.0
    kind, [[head, payload]] = enc.encode(1, layout, [w], 1 << 20, "l")
    from streamrl.comm import wire

    header = wire.decode_header([head])
    base = np.zeros(256, np.uint8)
    assert bytes(encoders.apply(payload, base, header)) == w.numpy().tobytes()
    with pytest.raises(wire.WireError, match="delta_corrupt: weights version 1 chunk 0: its delta does not"):
        encoders.apply(b"not zstd", base, header)
    base[0] = 1
    with pytest.raises(wire.WireError, match="delta_checksum: .* made from version 0"):
        encoders.apply(payload, base, header)


def test_copy_chunk_zeroes_the_padding_of_a_reused_buffer_so_every_send_of_a_version_has_the_same_bytes():
    state = {"a": torch.ones(3), "b": torch.full((5,), 2.0), "c": torch.full((70,), 3.0)}  # 12- and 20-byte tensors
    layout = chunks.Layout(state)
    expected = chunks.encode_weights(0, state)[0][1]  # a fresh zeroed buffer
    for start, size in ((0, layout.total), (40, 100), (100, layout.total - 100)):
        dirty = torch.full((size,), 0xFF, dtype=torch.uint8)  # a pool buffer's leftovers
        chunks.copy_chunk(layout, list(state.values()), start, dirty)
        assert bytes(dirty.numpy()) == bytes(expected[start:start + size])


def _stuck_subscriber(pub: WeightPublisher) -> zmq.Socket:
    """A SUB that takes one chunk in and reads no more: TCP's buffers fill and the PUB's chunks stay held."""
    stuck = zmq.Context.instance().socket(zmq.SUB)
    stuck.setsockopt(zmq.RCVHWM, 1)
    stuck.setsockopt(zmq.RCVBUF, 1 << 16)
    stuck.setsockopt(zmq.SUBSCRIBE, b"")
    stuck.connect(pub.pub.getsockopt_string(zmq.LAST_ENDPOINT))
    return stuck


@pytest.mark.parametrize("mode", ["off", "on"])
def test_a_subscriber_that_goes_away_releases_the_send_it_held_at_once_not_after_the_stall(channel, mode):
    pub, control, sub = channel(chunk_bytes=1 << 20, mode=mode)
    pub.stall_s = 60.0
    stuck = _stuck_subscriber(pub)
    joined(pub.pub, sub.sub, stuck)
    state = {"w": torch.randn(12 << 20, generator=torch.Generator().manual_seed(0))}  # 48 MB
    pub.publish(0, state, wait=False)
    receive(sub, 0, control)
    time.sleep(0.5)
    assert not pub._job.done()  # the stuck peer holds the send
    stuck.close(linger=0)  # its process died: the kernel closes the connection
    t0 = time.perf_counter()
    pub.flush()  # the send ends once the socket notices the peer has gone
    assert time.perf_counter() - t0 < 20.0 and pub.reopened == 0


def test_a_subscriber_that_stops_reading_never_holds_the_learners_step_and_the_others_get_the_newest(channel):
    """A SUB that stops reading (a dead link, a stopped process) keeps the PUB's chunks: with deltas `settle` (the
    optimizer step's wait) skips a version queued behind that send instead of waiting for it, and the send is given
    up within superseded_stall_s, so the other subscribers' weights do not freeze for `stall_s` either."""
    pub, control, sub = channel(chunk_bytes=1 << 20)
    pub.stall_s = 60.0  # what the stuck peer would cost each waiting step: far beyond the bound asserted below
    stuck = _stuck_subscriber(pub)
    joined(pub.pub, sub.sub, stuck)
    g = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(12 << 20, generator=g)}  # 48 MB: more than socket buffers hold
    try:
        pub.publish(0, state, wait=False)
        receive(sub, 0, control)  # the healthy subscriber has it all; the stuck one holds the send
        waits = []
        for v in range(1, 6):
            t0 = time.perf_counter()
            pub.settle()
            waits.append(time.perf_counter() - t0)
            state["w"][v * 1000:v * 1000 + 50] += 1.0
            pub.publish(v, state, wait=False)
            time.sleep(0.2)  # the rest of a learner step
        assert pub.skipped >= 3, pub.skipped  # versions 1.. were queued behind the held send, and skipped
        assert max(waits) < 5.0, waits  # never the stall (60 s here)
        # With a newer version waiting, the held send is given up after superseded_stall_s without progress (the
        # socket reopened, the stuck peer dropped), not stall_s: the healthy subscriber gets the newest meanwhile.
        got = receive(sub, 5, control)
        assert torch.equal(bits(got["w"]), bits(state["w"])) and pub.reopened == 1
    finally:
        stuck.close(linger=0)
    assert set(sub.rejected.counts) <= {"chunk_lost"}, sub.rejected.counts  # the version cut by the reopen, if any


def test_without_deltas_the_learner_waits_for_a_stuck_subscriber_about_a_second_not_the_stall(channel):
    """Chunks sent from the parameters themselves must be out before the optimizer changes them: `settle` waits, but a
    send that makes no progress is given up after superseded_stall_s (plus a chunk at 100 Mbit/s), not stall_s."""
    pub, control, sub = channel(chunk_bytes=1 << 20, mode="off")
    pub.stall_s = 60.0
    stuck = _stuck_subscriber(pub)
    joined(pub.pub, sub.sub, stuck)
    state = {"w": torch.randn(12 << 20, generator=torch.Generator().manual_seed(0))}  # 48 MB
    try:
        pub.publish(0, state, wait=False)
        t0 = time.perf_counter()
        pub.settle()
        waited = time.perf_counter() - t0
        assert waited < 10.0 and pub.reopened == 1, waited  # ~1.1 s here
        pub.publish(1, state, wait=False)  # the healthy subscriber, reconnected, gets the next version
        got = receive(sub, 1, control)
        assert torch.equal(got["w"], state["w"])
    finally:
        stuck.close(linger=0)
