"""streamrl.comm.weights.ipc over the real weight and control channels on loopback, with a handle provider that
shares buffers inside this process (tests/fakes/ipc.py; CUDA IPC itself is tests/gpu/test_ipc_weights_cuda.py):
the manifest and its check, versions in order, buffers freed on acknowledgement, and the fall back to ZeroMQ."""

from __future__ import annotations

import logging
import time

import msgspec
import pytest
import torch
import zmq
from fakes.ipc import SameProcess
from fakes.pubsub import bound

from streamrl.comm import wire
from streamrl.comm.control import ControlServer, Inbox
from streamrl.comm.weights import ipc
from streamrl.comm.weights.publisher import WeightPublisher
from streamrl.comm.weights.subscriber import WeightSubscriber

pytestmark = pytest.mark.timeout(60)

ANY = "tcp://127.0.0.1:*"
MAX_BYTES = 1 << 20


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(4, 3, generator=g), "b": torch.randn(3, generator=g).to(torch.bfloat16),
            "n": torch.arange(5, dtype=torch.int64) + seed}


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class Channel:
    """The learner's publisher, control server and IPC exporter, and one actor's subscriber with its IPC receiver,
    joined (the actor holds version 0, sent over ZeroMQ as every first version is)."""

    def __init__(self, ctx, track, provider: SameProcess, actors: int = 1):
        self.pub = track(WeightPublisher(ctx, ANY, max_bytes=MAX_BYTES))
        self.ctl = track(ControlServer(ctx, ANY, self.pub))
        self.exporter = ipc.IpcExporter(provider, actors)
        self.ctl.acks = self.exporter.ack
        inbox = track(Inbox(ctx, bound(self.ctl.sock), "actor-0", MAX_BYTES))
        self.sub = track(WeightSubscriber(ctx, bound(self.pub.pub), inbox, MAX_BYTES))
        self.receiver = ipc.IpcReceiver(provider, "actor-0", _state(0), torch.device("cpu"), inbox.ack)
        self.sub.sync = self.receiver.receive
        self.pub.publish(0, _state(0))
        assert self.wait(0)[0] == 0

    def send(self, version: int, tamper=None) -> wire.WeightsIpc:
        """Publish `version` the way LearnerWeights does over IPC: kept for requests, announced with its handles."""
        state = _state(version)
        self.pub.publish(version, state, broadcast=False)
        msg = self.exporter.announcement(version, state, self.pub.session)
        self.pub.announce(tamper(msg) if tamper else msg)
        return msg

    def wait(self, version: int):
        return self.sub.wait_for(version, timeout_s=20.0, ask_first=version == 0, ask_every_s=0.5,
                                 stop=lambda: self.ctl.serve() < 0)

    def serve_until(self, cond) -> None:
        deadline = time.monotonic() + 10
        while not cond():
            assert time.monotonic() < deadline, "timed out"
            self.ctl.serve()
            time.sleep(0.02)


def test_an_ipc_manifest_round_trips_through_msgspec_and_verifies():
    exporter = ipc.IpcExporter(SameProcess(), actors=2)
    msg = exporter.announcement(7, _state(7), "learner-a")
    back = wire.decode_header(wire.encode(msg))
    assert back == msg and isinstance(back, wire.WeightsIpc) and len(back.handles) == 2
    expected = {k: wire.TensorInfo.of(k, t.dtype, t.shape) for k, t in _state(0).items()}
    ipc.verify(back, expected, "same-process")  # raises if anything is off
    assert all(o % 64 == 0 for o in back.offsets) and back.total >= back.offsets[-1] + 5 * 8


@pytest.mark.parametrize("field", ["offsets", "tensors", "total", "version"])
def test_a_tampered_ipc_manifest_is_refused_before_any_handle_is_opened(field):
    provider = SameProcess()
    msg = ipc.IpcExporter(provider, actors=1).announcement(3, _state(3), "learner-a")
    changed = {"offsets": [msg.offsets[0], msg.offsets[1] + 64, msg.offsets[2]],
               "tensors": [wire.TensorInfo("w", "float32", [3, 4]), *msg.tensors[1:]],
               "total": msg.total * 2, "version": 4}[field]
    tampered = msgspec.structs.replace(msg, **{field: changed})
    receiver = ipc.IpcReceiver(provider, "actor-0", _state(0), torch.device("cpu"), lambda ack: None)
    with pytest.raises(wire.WireError, match="ipc_manifest: .*checksum"):
        receiver.receive(tampered)
    assert provider.opened == [] and receiver.failed is None


def test_a_tampered_manifest_on_the_channel_is_counted_and_its_version_comes_over_zeromq(zmq_ctx):
    ch = Channel(*zmq_ctx, SameProcess())
    ch.send(1, tamper=lambda m: msgspec.structs.replace(m, total=m.total + 64))
    version, tensors = ch.wait(1)
    assert version == 1 and _equal(tensors, _state(1))
    assert ch.sub.rejected.counts["ipc_manifest"] == 1
    assert ch.receiver.syncs == 0 and ch.sub.sync is not None  # still on IPC: the next version comes that way
    ch.send(2)
    assert _equal(ch.wait(2)[1], _state(2)) and ch.receiver.syncs == 1


def test_ipc_versions_arrive_in_order_a_stale_one_is_ignored_and_acknowledged_buffers_are_freed(zmq_ctx):
    provider = SameProcess()
    ch = Channel(*zmq_ctx, provider)
    first = ch.send(1)
    assert _equal(ch.wait(1)[1], _state(1))
    ch.serve_until(lambda: ch.exporter.acked.get("actor-0") == 1)  # the acknowledgement, over the control channel
    assert provider.held == 0 and ch.exporter.live == {}  # freed as soon as acknowledged
    ch.send(2)
    assert _equal(ch.wait(2)[1], _state(2))
    ch.pub.announce(first)  # version 1 again, after 2 (a late copy)
    ch.send(3)
    assert ch.wait(3)[0] == 3
    assert ch.sub.poll(100) is None and ch.receiver.syncs == 3  # 1, 2, 3: the stale 1 was never opened again
    assert len(provider.opened) == len(set(provider.opened)) == 3
    ch.serve_until(lambda: ch.exporter.acked.get("actor-0") == 3)
    assert provider.held == 0 and ch.exporter.released == 3


def test_an_exported_buffer_is_freed_only_once_every_actor_on_ipc_acknowledged_it():
    provider = SameProcess()
    exporter = ipc.IpcExporter(provider, actors=2, keep=3)
    for v in (1, 2):
        exporter.announcement(v, _state(v), "learner-a")
    exporter.ack(wire.WeightsIpcAck(actor_id="actor-0", version=2))
    assert sorted(exporter.live) == [1, 2]  # actor-1 has acknowledged nothing yet
    exporter.ack(wire.WeightsIpcAck(actor_id="actor-1", version=1))
    assert sorted(exporter.live) == [2]
    exporter.ack(wire.WeightsIpcAck(actor_id="actor-9", version=2))  # no such actor
    exporter.ack(wire.WeightsIpcAck(actor_id="actor-0", version=9))  # a version never exported
    assert sorted(exporter.live) == [2] and exporter.report()["refused_acknowledgements"] == 2
    exporter.ack(wire.WeightsIpcAck(actor_id="actor-1", version=2, ok=False, reason="no CUDA"))
    assert exporter.live == {} and provider.held == 0  # actor-1 left: actor-0's acknowledgement is all it takes
    assert exporter.announcement(3, _state(3), "learner-a").handles[1] == []  # and it gets no handle any more


def test_the_learner_holds_at_most_keep_unacknowledged_versions():
    provider = SameProcess()
    exporter = ipc.IpcExporter(provider, actors=1, keep=2)
    for v in range(1, 6):
        exporter.announcement(v, _state(v), "learner-a")
    assert sorted(exporter.live) == [4, 5] and provider.held == 2 and exporter.released_unacked == 3


def test_an_actor_whose_handle_cannot_be_opened_falls_back_to_zeromq_with_one_log_line(zmq_ctx, caplog):
    provider = SameProcess(open_error=RuntimeError("peer access is not supported between device 0 and 1"))
    ch = Channel(*zmq_ctx, provider)
    with caplog.at_level(logging.WARNING):
        ch.send(1)
        version, tensors = ch.wait(1)
        assert version == 1 and _equal(tensors, _state(1))  # from the ROUTER's re-broadcast
        ch.serve_until(lambda: "actor-0" in ch.exporter.left)
        assert not ch.exporter.formed()  # every actor left: the learner sends over ZeroMQ from now on
        ch.pub.publish(2, _state(2))
        assert _equal(ch.wait(2)[1], _state(2))
    lines = [r for r in caplog.records if r.name == ipc.log.name]  # one process here, two in a run: a line each
    actor = [r.message for r in lines if r.levelno == logging.ERROR]
    learner = [r.message for r in lines if r.levelno == logging.WARNING]
    assert len(lines) == 2 and len(actor) == 1 and len(learner) == 1
    assert "peer access is not supported" in actor[0] and "over ZeroMQ from now on" in actor[0]
    assert learner[0].startswith("weight sync ipc: actor-0 takes ZeroMQ from now on")
    assert ch.sub.sync is None and ch.receiver.failed and provider.held == 0
    assert "peer access" in ch.exporter.left["actor-0"]


def test_a_learner_without_cuda_leaves_ipc_with_one_log_line(caplog, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # (and CUDA stays untouched where there is one)
    exporter = ipc.IpcExporter(ipc.CudaIpc(), actors=1)
    with caplog.at_level(logging.ERROR):
        assert not exporter.formed() and not exporter.formed()
    assert [r.message for r in caplog.records] == ["weight sync ipc: no CUDA on the learner; weights go over "
                                                   "ZeroMQ from now on"]
    assert exporter.report()["failed"] == "no CUDA on the learner"


def test_cuda_ipc_refuses_to_export_a_cpu_buffer():
    with pytest.raises(ValueError, match="exports CUDA tensors"):
        ipc.CudaIpc().export(torch.zeros(8, dtype=torch.uint8))
