"""transport.weight_sync=ipc on the engines: each version is loaded by the engine itself (streamrl.comm.weights.ipc's
receiver with `into`, the backend's `receive_weight_ipc`). vLLM's workers open the learner's handle on their own
devices and stream views of it into the in-place reload; SGLang's actor opens it and hands the engine one fresh copy
per bucket. Through the fake engines, with a handle provider that shares buffers inside this process
(tests/fakes/ipc.py; CUDA IPC itself: tests/gpu)."""

from __future__ import annotations

import pytest
import torch
from fakes import fake_sglang, fake_vllm
from fakes.ipc import SameProcess

from streamrl import config
from streamrl.comm import wire
from streamrl.comm.weights import ipc
from streamrl.comm.weights.engine_sync import InEngine
from streamrl.models import lora, model


@pytest.fixture
def provider(monkeypatch) -> SameProcess:
    p = SameProcess()
    monkeypatch.setitem(ipc.PROVIDERS, p.name, p)  # what an engine's worker looks the manifest's provider up in
    return p


def _engine(monkeypatch, backend: str, *overrides: str):
    fake = fake_vllm if backend == "vllm" else fake_sglang
    engine_cls = fake.install(monkeypatch)
    from streamrl.actors.backends import build

    cfg = config.load(None, [f"actors.backend={backend}", "transport.weight_sync=ipc", *overrides])
    m, tok = model.build(cfg)
    built = build(backend, cfg, m, tok)
    return built, engine_cls.instances[-1], lora.published(m.state_dict())


def _receiver(provider, backend, state, acks: list) -> ipc.IpcReceiver:
    return ipc.IpcReceiver(provider, "actor-0", state, torch.device("cpu"), acks.append,
                           into=backend.receive_weight_ipc)


def _new(state: dict) -> dict:
    return {k: v + 1 if v.is_floating_point() else v for k, v in state.items()}


def test_vllms_workers_each_open_the_handle_and_load_the_version_in_place_from_it(monkeypatch, provider):
    backend, llm, state = _engine(monkeypatch, "vllm", "actors.tensor_parallel_size=2")
    acks: list = []
    receiver = _receiver(provider, backend, state, acks)
    new = _new(state)
    exporter = ipc.IpcExporter(provider, actors=1)
    got = receiver.receive(exporter.announcement(4, new, "L"))
    assert isinstance(got, InEngine) and not got  # the actor has nothing left to load
    assert acks == [wire.WeightsIpcAck(actor_id="actor-0", version=4)]  # acknowledged once loaded
    rpc = [c for c in llm.calls if c[0] == "collective_rpc"]
    assert [c[1]["method"] for c in rpc] == ["load_weights_from_ipc"]
    assert isinstance(rpc[0][1]["kwargs"]["handle"], list)  # the msgpack-able handle, nothing pickled
    for worker in llm.workers:  # every tensor-parallel rank took the whole version from the learner's buffer
        loaded = worker.model_runner.reloads[-1]
        assert loaded.keys() == new.keys() and all(torch.equal(loaded[k], new[k]) for k in new)
    assert provider.opened == [0, 0] and llm.calls[-1][0] == "reset_prefix_cache"
    assert backend.engine_stats()["ipc_updates"] == 1 and receiver.report()["syncs"] == 1
    exporter.ack(acks[0])
    assert provider.held == 0  # freed once the engine had loaded it


def test_sglangs_actor_opens_the_handle_and_gives_the_engine_a_fresh_copy_per_bucket_in_one_session(monkeypatch,
                                                                                                 provider):
    backend, engine, state = _engine(monkeypatch, "sglang", "actors.update_bucket_bytes=4096")
    acks: list = []
    new = _new(state)
    exporter = ipc.IpcExporter(provider, actors=1)
    assert isinstance(_receiver(provider, backend, state, acks).receive(exporter.announcement(2, new, "L")), InEngine)
    buffer = exporter.live[2].untyped_storage().data_ptr()
    updates = [kw for name, kw in engine.calls if name == "update_weights_from_tensor"]
    assert len(updates) == len(backend.plan.buckets) > 1
    sent = [t for kw in updates for _, t in kw["named_tensors"]]
    # torch refuses to send on a CUDA tensor received over IPC: what the engine gets owns its memory
    assert all(t.untyped_storage().data_ptr() != buffer for t in sent)
    assert [kw["flush_cache"] for kw in updates] == [False] * (len(updates) - 1) + [True]
    names = [name for name, _ in engine.calls]
    assert names[0] == "begin_weight_update" and names[-1] == "end_weight_update"
    assert engine.weights.keys() == new.keys()
    assert all(torch.equal(engine.weights[k], new[k].to(engine.weights[k].dtype)) for k in new)
    assert acks == [wire.WeightsIpcAck(actor_id="actor-0", version=2)] and backend.engine_stats()["ipc_updates"] == 1


def test_an_engine_that_fails_a_version_leaves_ipc_for_zeromq_and_says_why(monkeypatch, provider, caplog):
    backend, engine, state = _engine(monkeypatch, "sglang")
    engine.fail["update_weights_from_tensor"] = "out of memory"
    acks: list = []
    receiver = _receiver(provider, backend, state, acks)
    exporter = ipc.IpcExporter(provider, actors=1)
    assert receiver.receive(exporter.announcement(1, _new(state), "L")) is None  # the subscriber asks over ZeroMQ
    assert not engine.session  # the weight-update session was closed after the failed step
    assert acks[0].ok is False and "out of memory" in acks[0].reason and "in the engine" in acks[0].reason
    assert "weights go over ZeroMQ from now on" in caplog.text
    assert receiver.receive(exporter.announcement(2, _new(state), "L")) is None and len(acks) == 1  # left for good
    exporter.ack(acks[0])
    assert exporter.left == {"actor-0": acks[0].reason}


def test_a_worker_that_cannot_open_the_handle_falls_back_and_names_the_provider_it_lacks(monkeypatch):
    backend, llm, state = _engine(monkeypatch, "vllm")
    provider = SameProcess()  # not in ipc.PROVIDERS: an engine worker of another process would not know it either
    acks: list = []
    got = _receiver(provider, backend, state, acks).receive(ipc.IpcExporter(provider, 1).announcement(1, state, "L"))
    assert got is None and "no IPC handle provider named 'same-process'" in acks[0].reason
    assert "cuda" in acks[0].reason  # ... and lists those it knows


def test_the_actor_wires_the_engines_ipc_receiver_to_the_backend_without_a_gpu_model(monkeypatch):
    from streamrl.actors.weights import _ipc

    backend, _, _ = _engine(monkeypatch, "vllm")
    m = torch.nn.Linear(2, 2)  # the actor's own copy, on the CPU: the engine's workers open the handles
    sent: list = []
    inbox = type("Inbox", (), {"ack": sent.append})()
    receiver = _ipc("actor-1", m, inbox, backend, engine=True)
    assert receiver.into == backend.receive_weight_ipc and receiver.provider.name == "cuda" and sent == []
    assert _ipc("actor-1", m, inbox, backend, engine=False) is None and sent[0].ok is False  # hf on the CPU: ZeroMQ
