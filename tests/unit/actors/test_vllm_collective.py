"""transport.weight_sync=collective on vLLM: the engine's workers are the group's ranks and load each version in
place (streamrl.comm.weights.engine_sync, the worker extension's join/receive), through the fake vLLM's workers and a
real gloo group with the learner's end in this process."""

from __future__ import annotations

import threading

import torch
from fakes.fake_vllm import install

from streamrl import config
from streamrl.commands.launch import free_ports
from streamrl.comm.weights.collective import LearnerSync
from streamrl.comm.weights.engine_sync import EngineSync, InEngine
from streamrl.models import lora, model


def _backend(monkeypatch, tp: int):
    llm_cls = install(monkeypatch, cpu=True)
    from streamrl.actors.backends import build

    cfg = config.load(None, ["actors.backend=vllm", "transport.weight_sync=collective",
                             f"actors.tensor_parallel_size={tp}"])
    m, tok = model.build(cfg)
    return build("vllm", cfg, m, tok), llm_cls.instances[-1], lora.published(m.state_dict())


def test_each_engine_worker_joins_as_a_rank_and_loads_the_broadcast_version_in_place(monkeypatch):
    backend, llm, state = _backend(monkeypatch, tp=2)
    (port,) = free_ports(1)
    learner = LearnerSync("127.0.0.1", port, 2, timeout_s=30, rendezvous_s=30, bucket_bytes=1 << 16,
                          first_wait_s=30)  # one actor of 2 workers: 2 receivers
    sync = EngineSync(lambda first, world: backend.join_weight_sync("127.0.0.1", port, first, world, 30, 30),
                      backend.receive_weight_sync, index=0, actors=1, engine_workers=2, expected=state)
    assert sync.ready and learner.formed()
    new = {k: v + 1 for k, v in state.items()}
    msg = learner.announcement(3, new, "L")
    sent = threading.Thread(target=learner.send, args=(3, new))
    sent.start()
    got = sync.receive(msg)
    sent.join()
    assert isinstance(got, InEngine) and not got  # nothing for the actor to load: the workers did
    calls = len(llm.calls)
    backend.load_weights(got)
    assert len(llm.calls) == calls  # ... and loading it again is no call at all
    for worker in llm.workers:  # every tensor-parallel rank took the whole version (and would keep its shard)
        loaded = worker.model_runner.reloads[-1]
        assert loaded.keys() == new.keys() and all(torch.equal(loaded[k], new[k]) for k in new)
    assert sync.report() == {"syncs": 1, "sync_s": sync.report()["sync_s"], "failed": None}
    assert learner.report()["syncs"] == 1 and llm.calls[-1][0] == "reset_prefix_cache"


def test_an_announcement_for_another_model_leaves_the_collective_and_a_join_that_fails_falls_back(monkeypatch):
    backend, llm, state = _backend(monkeypatch, tp=1)
    sync = EngineSync(lambda first, world: None, backend.receive_weight_sync, 0, 1, 1, state)
    other = {**state, "extra.weight": torch.zeros(2)}
    learner = object.__new__(LearnerSync)
    learner.plan, learner.bucket_bytes = None, 1 << 16
    assert sync.receive(learner.announcement(1, other, "L")) is None  # then asked for over ZeroMQ
    assert "differ from this actor's model" in sync.failed and not any(c[0] == "collective_rpc" for c in llm.calls)

    def refused(first, world):
        raise RuntimeError("worker 0: could not meet the others within 1s")

    gone = EngineSync(refused, backend.receive_weight_sync, 0, 1, 1, state)
    assert not gone.ready and "could not meet" in gone.failed and gone.receive(None) is None
