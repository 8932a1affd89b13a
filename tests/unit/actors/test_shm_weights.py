"""Weights through node-local shared memory (actor → vLLM workers): what is written is what is read,
bucket by bucket, version after version, with a clear error on bad input; and its speed next to a
plain memory copy of the same bytes."""

from __future__ import annotations

import os
import time

import pytest
import torch

import streamrl.actors.backends.shm_weights as shm
from streamrl.comm.weights.collective import plan


@pytest.fixture
def folder():
    f = shm.new_folder()
    yield f
    shm.remove(f)


def _state() -> dict[str, torch.Tensor]:
    state = {"a": torch.randn(3, 4), "b": torch.arange(6.0).reshape(2, 3).t(),  # non-contiguous
             "c": torch.randn(5).bfloat16(), "empty": torch.empty(0), "scalar": torch.tensor(3.0)}
    state["tied"] = state["a"]  # two names, one memory
    return state


def test_each_version_reads_back_exactly_in_plan_order_from_the_same_files(folder):
    state = _state()
    p = plan(state, 40)
    for k in (1, 2):
        buckets = shm.write({n: t * k for n, t in state.items()}, p, folder)
        assert [[name for name, _, _ in b] for b in buckets] == [[t.name for t in b] for b in p.buckets]
        got = list(shm.read(folder, buckets))
        assert [n for n, _ in got] == list(state)
        assert all(torch.equal(t, state[n] * k) and t.dtype == state[n].dtype for n, t in got)
        if k == 1:
            inodes = sorted(os.stat(os.path.join(folder, f)).st_ino for f in os.listdir(folder))
    assert inodes == sorted(os.stat(os.path.join(folder, f)).st_ino for f in os.listdir(folder))


def test_a_tensor_unlike_the_plan_is_refused_with_its_name(folder):
    state = _state()
    p = plan(state, 1 << 20)
    with pytest.raises(ValueError, match=r"weight update: a is torch.float32 \[2, 2\], the plan says float32 \[3, 4\]"):
        shm.write({**state, "a": torch.ones(2, 2)}, p, folder)


def test_a_bucket_file_of_the_wrong_size_is_refused_before_any_tensor_is_read(folder):
    state = {"w": torch.ones(4)}
    buckets = shm.write(state, plan(state, 1 << 20), folder)
    os.truncate(os.path.join(folder, "bucket-0"), 8)
    with pytest.raises(ValueError, match="bucket-0: 8 bytes, the bucket's tensors need 16"):
        next(shm.read(folder, buckets))


def test_writing_and_reading_a_version_run_near_memory_copy_speed(folder):
    """Benchmark: 64 MiB in 8 MiB tensors; ratios against plain copies of the same bytes, same run."""
    state = {f"w{i}": torch.randn(2048, 1024) for i in range(8)}
    params = {n: torch.empty_like(t) for n, t in state.items()}
    flat = torch.empty(sum(t.numel() for t in state.values()))
    p = plan(state, 16 << 20)
    best = {"write": 1e9, "copy in": 1e9, "read": 1e9, "copy out": 1e9}
    for _ in range(3):
        t0 = time.perf_counter()
        torch.cat([t.reshape(-1) for t in state.values()], out=flat)
        t1 = time.perf_counter()
        buckets = shm.write(state, p, folder)
        t2 = time.perf_counter()
        for n, t in shm.read(folder, buckets):
            params[n].copy_(t)  # what vLLM's weight loaders do with each tensor
        t3 = time.perf_counter()
        for n, t in state.items():
            params[n].copy_(t)
        t4 = time.perf_counter()
        for key, s in zip(best, (t2 - t1, t1 - t0, t3 - t2, t4 - t3)):
            best[key] = min(best[key], s)
    write, read = best["copy in"] / best["write"], best["copy out"] / best["read"]
    print(f"\nshm weights, 64 MiB: write {write:.2f} x a memory copy, map + copy out {read:.2f} x a memory copy")
    assert write > 0.05 and read > 0.05  # loose floors: a per-element or per-page slow path would fall below
