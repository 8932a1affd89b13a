"""The collective weight sync into SGLang engines (transport.weight_sync=collective, actors.backend=sglang): the
learner's real end (`LearnerSync` in SGLang's named-group convention) against the sglang backend on the fake Engine,
whose `init_weights_update_group` and `update_weights_from_distributed` form and receive on a real gloo group exactly
as SGLang's worker does (tests/fakes/fake_sglang.py, checked against the released source by test_sglang_source.py).
Each end in a process of its own, as in a run."""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
import time
import types

import pytest
import torch

from streamrl.commands.launch import free_ports

pytestmark = pytest.mark.slow
VERSION = 3


def _tiny():
    from streamrl import config
    from streamrl.models import model

    cfg = config.load(None, ["actors.backend=sglang", "transport.weight_sync=collective", "actors.threads=1"])
    return cfg, *model.build(cfg)


def _published(m) -> dict[str, torch.Tensor]:
    """What the learner sends: the model's weights moved, so a version that never arrived cannot pass."""
    return {k: v * 1.5 + 0.25 for k, v in m.state_dict().items()}


def _learner(port: int, actors: int, out: str) -> None:
    from streamrl.comm.weights.collective import LearnerSync
    from streamrl.comm.weights.named_group import ENGINE_GROUP

    torch.set_num_threads(1)
    _, m, _ = _tiny()
    sync = LearnerSync("127.0.0.1", port, actors, timeout_s=10, rendezvous_s=90, bucket_bytes=64 * 1024,
                       first_wait_s=90, group_name=ENGINE_GROUP)
    formed = sync.formed()
    state = _published(m)
    sync.announcement(VERSION, state, "learner")  # the plan, which the actors rebuild below (a run sends it)
    sent = formed and sync.send(VERSION, state)
    with open(f"{out}/learner.json", "w") as f:
        json.dump({"formed": formed, "sent": sent, "buckets": len(sync.plan.buckets), **sync.report()}, f)


def _actor(port: int, index: int, actors: int, out: str, fail: bool) -> None:
    from fakes import fake_sglang

    from streamrl.actors.backends import build
    from streamrl.comm.weights.collective import plan
    from streamrl.comm.weights.engine_sync import EngineSync
    from streamrl.comm.wire import WeightsCollective

    torch.set_num_threads(1)
    root = types.ModuleType("sglang")
    root.Engine = fake_sglang.Engine
    sys.modules["sglang"] = root
    cfg, m, tok = _tiny()
    backend = build("sglang", cfg, m, tok)
    engine = fake_sglang.Engine.instances[-1]
    if fail:
        engine.fail["update_weights_from_distributed"] = "Failed to update parameter online: shape mismatch."
    sync = EngineSync(lambda first, world: backend.join_weight_sync("127.0.0.1", port, first, world, 10, 90),
                      backend.receive_weight_sync, index, actors, 1, m.state_dict())
    state = _published(m)
    msg = WeightsCollective(version=VERSION, buckets=plan(state, 64 * 1024).buckets, sent_at=time.time(),
                            learner="learner")
    got = sync.receive(msg)
    if got is not None:
        backend.load_weights(got)  # what the actor does with it: nothing left to load
    exact = set(engine.weights) == set(state) and all(torch.equal(engine.weights[k], v) for k, v in state.items())
    calls = [name for name, _ in engine.calls if name != "generate"]
    flushes = [kw["flush_cache"] for name, kw in engine.calls if name == "update_weights_from_distributed"]
    formats = {kw["load_format"] for name, kw in engine.calls if name == "update_weights_from_distributed"}
    init = next(kw for name, kw in engine.calls if name == "init_weights_update_group")
    with open(f"{out}/actor-{index}.json", "w") as f:
        json.dump({"received": got is not None, "exact": exact, "calls": calls, "flushes": flushes,
                   "formats": sorted(formats), "rank_offset": init["rank_offset"], "world": init["world_size"],
                   "stats": backend.engine_stats(), **sync.report()}, f)


def _run(tmp_path, actors: int, failing: set[int]) -> dict:
    port, = free_ports(1)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_learner, args=(port, actors, str(tmp_path)))]
    procs += [ctx.Process(target=_actor, args=(port, i, actors, str(tmp_path), i in failing)) for i in range(actors)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 240
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [p.name for p in procs if p.exitcode is None]
    for p in procs:
        if p.exitcode is None:
            p.kill()
    assert not hung, f"processes hung: {hung}"
    return {f.stem: json.loads(f.read_text()) for f in tmp_path.glob("*.json")}


def test_two_sglang_engines_take_a_version_from_the_learners_group_in_sglangs_own_calls(tmp_path):
    out = _run(tmp_path, actors=2, failing=set())
    learner = out["learner"]
    assert learner["formed"] and learner["sent"] and learner["failed"] is None and learner["syncs"] == 1
    for i in range(2):
        a = out[f"actor-{i}"]
        assert a["received"] and a["exact"], a  # every tensor, bit for bit, in the engine
        assert (a["rank_offset"], a["world"]) == (1 + i, 3)
        # one session around one flattened-bucket call per bucket, the cache flushed once, with the last
        assert a["calls"] == ["init_weights_update_group", "begin_weight_update",
                              *["update_weights_from_distributed"] * learner["buckets"], "end_weight_update"]
        assert learner["buckets"] > 1 and a["flushes"] == [False] * (learner["buckets"] - 1) + [True]
        assert a["formats"] == ["flattened_bucket"]
        assert a["syncs"] == 1 and a["stats"]["collective_updates"] == 1


@pytest.mark.long
def test_a_load_sglang_refuses_turns_both_ends_back_to_zeromq_within_the_timeout(tmp_path):
    out = _run(tmp_path, actors=1, failing={0})
    learner, actor = out["learner"], out["actor-0"]
    assert not actor["received"] and "Failed to update parameter online: shape mismatch." in actor["failed"]
    assert actor["calls"][-1] == "end_weight_update"  # the session closed after the refused step
    # the learner's next bucket finds no receiver: it leaves the collective at its timeout, not hangs
    assert learner["formed"] and not learner["sent"] and "bucket 1" in learner["failed"], learner
