"""Bucketed collective weight sync between processes, on gloo (the same code runs NCCL on GPUs)."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from streamrl import weight_sync
from streamrl.launch import free_ports

pytestmark = pytest.mark.slow


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"embed": torch.randn(50, 8, generator=g), "ln": torch.randn(8, generator=g),
            "step": torch.arange(5, dtype=torch.int64), "head": torch.randn(8, 50, generator=g)}


def _worker(rank: int, world: int, port: int, out: str, mode: str) -> None:
    torch.set_num_threads(1)
    try:
        group = weight_sync.Group("127.0.0.1", port, rank, world, timeout_s=4 if mode == "silent" else 60,
                                  backend="gloo")
        state = _state()
        sync_plan = weight_sync.plan(state, bucket_bytes=2000)
        if rank == 0:
            if mode == "silent":      # the learner never sends: workers must fail, not hang
                import time

                time.sleep(8)
            elif mode == "corrupt":   # a bucket whose checksum does not match what arrives
                group.broadcast(torch.tensor([3, len(sync_plan.buckets)]), "header")
                flats = [weight_sync.flatten(state[s.name] for s in b) for b in sync_plan.buckets]
                for f in flats:
                    group.broadcast(f, "bucket")
                sums = torch.tensor([weight_sync.checksum(f) for f in flats], dtype=torch.float64)
                sums[1] += 1.0
                group.broadcast(sums, "checksums")
            else:
                buckets = (weight_sync.flatten(state[s.name] for s in b) for b in sync_plan.buckets)
                weight_sync.send(group, 7, sync_plan, buckets)
            return
        got: dict = {}
        stats = weight_sync.receive(group, sync_plan, lambda tensors: got.update(tensors))
        ok = all(torch.equal(got[k], v) for k, v in state.items()) and set(got) == set(state)
        with open(f"{out}/rank{rank}", "w") as f:
            f.write(f"ok={ok} version={stats['version']} buckets={stats['buckets']}")
    except weight_sync.WeightSyncError as e:
        with open(f"{out}/rank{rank}", "w") as f:
            f.write(f"error={e}")


def _run(tmp_path, mode: str, world: int = 3) -> list[str]:
    port = free_ports(1)[0]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(r, world, port, str(tmp_path), mode)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode is not None, "a sync process hung"
    return [(tmp_path / f"rank{r}").read_text() for r in range(1, world)]


def test_plan_cuts_buckets_by_size_and_dtype():
    p = weight_sync.plan(_state(), bucket_bytes=2000)
    assert [[t.name for t in b] for b in p.buckets] == [["embed", "ln"], ["step"], ["head"]]
    p = weight_sync.plan({"a": torch.zeros(10), "b": torch.zeros(10), "c": torch.zeros(200)}, bucket_bytes=100)
    assert [[t.name for t in b] for b in p.buckets] == [["a", "b"], ["c"]]


def test_two_workers_receive_every_tensor_exactly_in_buckets(tmp_path):
    assert _run(tmp_path, "ok") == ["ok=True version=7 buckets=3"] * 2


def test_a_corrupt_bucket_is_refused_before_the_engine_sees_it(tmp_path):
    results = _run(tmp_path, "corrupt", world=2)
    assert results[0].startswith("error=weight sync version 3: bucket 1 checksum")
    assert "discarded" in results[0]


def test_a_silent_learner_is_an_error_within_the_timeout_not_a_hang(tmp_path):
    results = _run(tmp_path, "silent", world=2)
    assert results[0].startswith("error=weight sync: header") and "4s" in results[0]
