"""The two ends of the weight channel (learner.weights.LearnerWeights, actors.weights.ActorWeights)
over real ZeroMQ sockets on loopback, in one process: first weights, newest-only loads, a learner
restart seen mid-generation, and the learner's optimizer hook."""

from __future__ import annotations

import logging
import time
import types

import pytest
import torch
import zmq

from streamrl.actors.weights import ActorWeights
from streamrl.comm.control import ControlServer, Inbox
from streamrl.comm.sockets import endpoint
from streamrl.commands.launch import free_ports
from streamrl.config import load
from streamrl.learner.weights import LearnerWeights, host_copy_run_ahead
from streamrl.telemetry import actor_metrics, exporter, prometheus_metrics

pytestmark = pytest.mark.timeout(60)


class Recorder:
    """A backend that keeps what it was asked to load (the channel's only call into a backend)."""

    def __init__(self):
        self.loads: list[dict] = []

    def load_weights(self, state: dict) -> None:
        self.loads.append({k: v.clone() for k, v in state.items()})


def engine_at(value: float):
    """What LearnerWeights reads from the DeepSpeed engine: full_state_dict(), and the before_step hook."""
    state = {"w": torch.full((4, 3), value), "b": torch.zeros(3)}
    return types.SimpleNamespace(full_state_dict=lambda: state, published_state=lambda: state, before_step=None,
                                 state=state, device=torch.device("cpu"))


@pytest.fixture
def setup():
    yield from _setup([])


@pytest.fixture
def setup_ipc():
    yield from _setup(["transport.weight_sync=ipc", "actors.num=1"])


def _setup(overrides: list[str]):
    weights_port, request_port = free_ports(2)
    cfg = load(None, [f"transport.weights_port={weights_port}", f"transport.weights_request_port={request_port}",
                      "actors.inflight_updates=true", "actors.weights_timeout_s=20", *overrides])
    ctx = zmq.Context()
    opened = []

    def learner(value: float) -> LearnerWeights:
        telemetry = prometheus_metrics.LearnerMetrics(prometheus_metrics.new_registry(), "t", "corpo", [0, 1], 2)
        opened.append(w := _Learner(cfg, ctx, engine_at(value), telemetry))
        return w

    def actor(backend) -> ActorWeights:
        telemetry = actor_metrics.ActorMetrics(prometheus_metrics.new_registry(), "t", "actor-0")
        opened.append(inbox := Inbox(ctx, endpoint("127.0.0.1", request_port), "actor-0", 1 << 20))
        opened.append(w := ActorWeights(cfg, ctx, "127.0.0.1", 0, None, backend, torch.nn.Linear(3, 4), telemetry,
                                        exporter.Health("actor-0", 60), inbox))
        return w

    yield learner, actor
    for w in reversed(opened):
        w.close()
    ctx.destroy(linger=0)  # a socket a background sender still holds must not block the teardown in C


class _Learner(LearnerWeights):
    """The learner's weight channel with the control server its Session keeps beside it (requests, shutdown)."""

    def __init__(self, cfg, ctx, engine, telemetry):
        super().__init__(cfg, ctx, None, engine, telemetry)
        self.control = ControlServer(ctx, endpoint(cfg.transport.host, cfg.transport.weights_request_port),
                                     self.publisher)
        self.control.acks = self.acks

    def shutdown(self) -> None:
        self.control.shutdown()

    def close(self) -> None:
        super().close()
        self.control.close()


def serving(learner: _Learner):
    """A `stop` callback that answers weight requests while the actor waits (the learner's poller does this)."""
    return lambda: learner.control.serve() < 0


def until(cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_an_actor_loads_the_learners_first_weights_then_only_newer_versions_each_whole(setup):
    new_learner, new_actor = setup
    learner, backend = new_learner(1.0), Recorder()
    actor = new_actor(backend)
    learner.publish(0)
    assert actor.first(serving(learner)) and actor.version == 0
    assert torch.equal(backend.loads[0]["w"], torch.full((4, 3), 1.0))
    for v in (1, 2, 3):
        learner.settle()  # (what the optimizer step does before it changes the weights)
        learner.engine.state["w"].fill_(10.0 + v)
        learner.publish(v)
    seen = [actor.version]
    while actor.version < 3:  # broadcasts the actor was too slow for are asked for (the newest comes back)
        assert actor.wait_newer(serving(learner))
        seen.append(actor.version)
    assert seen == sorted(set(seen)) and len(seen) <= 4  # only ever newer versions, each loaded once
    assert [float(s["w"][0, 0]) for s in backend.loads] == [1.0] + [10.0 + v for v in seen[1:]]
    assert actor.report()["versions_applied"] == len(seen)
    actor.update()
    assert len(backend.loads) == len(seen)  # nothing newer waiting: nothing loaded


def test_a_restarted_learners_weights_seen_mid_generation_load_between_generate_calls(setup):
    new_learner, new_actor = setup
    first, backend = new_learner(1.0), Recorder()
    actor = new_actor(backend)
    first.publish(30)
    assert actor.first(serving(first)) and actor.version == 30
    first.shutdown()
    first.close()
    for _ in range(50):  # resumed from a checkpoint at version 20, on the same ports (once the old ones are free)
        try:
            second = new_learner(2.0)
            break
        except RuntimeError:
            time.sleep(0.1)

    def broadcast_and_look() -> bool:  # (again until the actor's SUB has reconnected to the new learner)
        second.publish(20)
        second.settle()
        assert actor.in_flight() == 30  # mid-generation: the samples in progress stay on the old life's weights
        return actor._held is not None

    until(broadcast_and_look, timeout_s=20)
    assert (actor.version, actor.life, len(backend.loads)) == (30, 0, 1)
    actor.update()  # between generate calls: resync to the restarted learner, at its own (lower) version
    assert (actor.version, actor.life) == (20, 1)
    assert torch.equal(backend.loads[-1]["w"], torch.full((4, 3), 2.0))


def test_the_learner_channel_makes_the_optimizer_wait_for_a_background_copy(setup):
    new_learner, _ = setup
    learner = new_learner(1.0)
    assert learner.engine.before_step == learner.publisher.settle
    assert "weight_sync" not in learner.report()  # zmq only: no collective to report


def test_the_hf_backend_loads_a_chunked_version_straight_into_its_parameters():
    from streamrl.actors.backends.hf import HFBackend
    from streamrl.comm.weights import assembly, chunks

    g = torch.Generator().manual_seed(0)
    learner = torch.nn.Sequential(torch.nn.Embedding(500, 64), torch.nn.Linear(64, 8))
    with torch.no_grad():
        for p in learner.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    actor = torch.nn.Sequential(torch.nn.Embedding(500, 64), torch.nn.Linear(64, 8))
    embedding = actor[0].weight
    state = learner.state_dict()
    messages = chunks.encode_weights(4, state, chunk_bytes=16 << 10, in_pieces=True)  # the embedding cut 8 times
    _, received = assembly.decode_weights([[bytes(memoryview(f).cast("B")) for f in m] for m in messages])
    HFBackend.load_weights(types.SimpleNamespace(model=actor, targets=actor.state_dict()), received)
    assert all(torch.equal(actor.state_dict()[k], t) for k, t in state.items())
    assert actor[0].weight is embedding  # in place: the engine's parameters are the same tensors
    HFBackend.load_weights(types.SimpleNamespace(model=actor, targets=actor.state_dict()), {k: t * 2 for k, t in state.items()})  # a plain dict
    assert torch.equal(actor[1].bias, state["1.bias"] * 2)


def test_prometheus_counts_the_bytes_actually_sent_full_and_as_deltas_apart():
    """streamrl_weight_publish_bytes_total{kind}: a delta version counts its compressed bytes, not the model's."""
    weights_port, request_port = free_ports(2)
    cfg = load(None, [f"transport.weights_port={weights_port}", f"transport.weights_request_port={request_port}",
                      "transport.weights_delta=on"])
    ctx = zmq.Context()
    registry = prometheus_metrics.new_registry()
    telemetry = prometheus_metrics.LearnerMetrics(registry, "t", "corpo", [0, 1], 2)
    state = {"w": torch.randn(256, 256), "b": torch.zeros(256)}
    engine = types.SimpleNamespace(published_state=lambda: state, before_step=None, device=torch.device("cpu"))
    learner = LearnerWeights(cfg, ctx, None, engine, telemetry)
    try:
        learner.publish(0)  # the first version goes full
        for v in (1, 2, 3):
            learner.flush()  # (the step between two versions: each is sent, none skipped)
            learner.settle()
            state["w"][v, :8] += 1.0  # 8 of 65,536 elements change: a delta of a few hundred bytes
            learner.publish(v)
    finally:
        learner.close()
        ctx.destroy(linger=0)

    def sent(kind: str) -> float:
        return registry.get_sample_value("streamrl_weight_publish_bytes_total", {**telemetry.labels, "kind": kind})

    full_versions, full_bytes = learner.publisher.encoder.stats["full"]
    delta_versions, delta_bytes = learner.publisher.encoder.stats["delta"]
    assert (full_versions, delta_versions) == (1, 3)
    assert sent("full") == full_bytes == learner.last_bytes  # one whole version
    assert sent("delta") == delta_bytes and 0 < delta_bytes < learner.last_bytes / 20  # what went, not 3 x the model


def test_weight_sync_ipc_without_cuda_falls_back_to_zeromq_end_to_end_with_one_line_each_side(setup_ipc, caplog,
                                                                                                  monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # (and CUDA stays untouched where there is one)
    new_learner, new_actor = setup_ipc
    with caplog.at_level(logging.ERROR):
        learner, backend = new_learner(1.0), Recorder()
        actor = new_actor(backend)
        learner.publish(0)
        assert actor.first(serving(learner))
        for v in (1, 2):
            learner.settle()
            learner.engine.state["w"].fill_(10.0 + v)
            learner.publish(v)
        while actor.version < 2:
            assert actor.wait_newer(serving(learner))
    assert float(backend.loads[-1]["w"][0, 0]) == 12.0
    lines = [r.message for r in caplog.records if "weight sync ipc" in r.message]
    assert lines == ["weight sync ipc: actor-0: the model is on cpu, not a CUDA device; weights go over ZeroMQ",
                     "weight sync ipc: no CUDA on the learner; weights go over ZeroMQ from now on"]
    assert learner.report()["weight_sync"]["ipc_versions"] == 0 and "weight_sync" not in actor.report()


def test_weight_sync_ipc_carries_versions_from_learner_to_actor_and_frees_them_on_acknowledgement(setup_ipc,
                                                                                                  monkeypatch):
    import sys

    from fakes.ipc import SameProcess

    from streamrl.comm.weights import ipc

    provider = SameProcess()  # CUDA IPC's stand-in on CPU: learner and actor share this process
    monkeypatch.setattr(sys.modules[LearnerWeights.__module__], "CudaIpc", lambda: provider)
    monkeypatch.setattr(sys.modules[ActorWeights.__module__], "_ipc", lambda actor_id, model, inbox, *_: ipc.IpcReceiver(
        provider, actor_id, engine_at(0.0).state, torch.device("cpu"), inbox.ack))
    new_learner, new_actor = setup_ipc
    learner, backend = new_learner(1.0), Recorder()
    actor = new_actor(backend)
    learner.publish(0)
    assert actor.first(serving(learner))  # the first version comes on request, over ZeroMQ
    for v in (1, 2):
        learner.settle()
        learner.engine.state["w"].fill_(10.0 + v)
        learner.publish(v)
        while actor.version < v:
            assert actor.wait_newer(serving(learner))
    assert [float(s["w"][0, 0]) for s in backend.loads][-1] == 12.0
    assert actor.report()["weight_sync"]["syncs"] >= 1 and actor.report()["weight_sync"]["failed"] is None
    until(lambda: serving(learner)() or learner.sync.acked.get("actor-0") == 2)
    assert provider.held == 0
    assert learner.report()["weight_sync"]["ipc_versions"] == 3


@pytest.mark.parametrize("mode,max_staleness,on_gpu,run_ahead", [
    ("auto", 2, False, None), ("auto", 8, False, None),  # on the CPU the parameters are sent in place
    ("auto", 2, True, None), ("auto", 3, True, None),  # a copy that could skip nothing is not made
    ("auto", 4, True, 1), ("auto", 8, True, 3), ("auto", 16, True, 7),
    ("on", 2, False, 0), ("on", 8, False, 3), ("off", 8, True, None)])
def test_a_host_copy_skips_only_as_many_versions_as_the_staleness_bound_can_absorb(mode, max_staleness, on_gpu,
                                                                                    run_ahead):
    """Skipping R versions behind each send lets groups reach the learner up to 2R + 2 versions old."""
    cfg = load(None, [f"transport.weights_host_copy={mode}", f"max_staleness={max_staleness}"])
    assert host_copy_run_ahead(cfg, on_gpu) == run_ahead
    if run_ahead is not None:
        assert 2 * run_ahead + 2 <= max(cfg.max_staleness, 2)
    assert host_copy_run_ahead(load(None, [f"transport.weights_host_copy={mode}", "on_policy=strict"]), on_gpu) in (
        None, 0)  # strict: every version is delivered before its groups come


def test_the_learners_weight_channel_takes_the_host_copy_its_device_and_staleness_call_for():
    weights_port, request_port = free_ports(2)
    cfg = load(None, [f"transport.weights_port={weights_port}", f"transport.weights_request_port={request_port}",
                      "max_staleness=8"])
    ctx = zmq.Context()
    telemetry = prometheus_metrics.LearnerMetrics(prometheus_metrics.new_registry(), "t", "corpo", [0, 1], 2)
    engine = types.SimpleNamespace(published_state=lambda: {}, before_step=None, device=torch.device("cuda", 0))
    learner = LearnerWeights(cfg, ctx, None, engine, telemetry)
    try:
        assert type(learner.publisher.encoder).__name__ == "HostCopyEncoder" and learner.publisher.encoder.run_ahead == 3
    finally:
        learner.close()
        ctx.destroy(linger=0)
