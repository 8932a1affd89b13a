"""streamrl.comm.weights.collective on a machine without NCCL: every collective tensor is made on the device the
group's backend takes, and the NCCL group is built so that a timeout cannot kill the process."""

from __future__ import annotations

import ast
import inspect
import os
import textwrap

import pytest
import torch
import torch.distributed as dist

from streamrl.comm.weights import checksums, collective


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_the_collective_device_is_the_one_torch_maps_to_the_backend(backend):
    device = collective.collective_device(backend)
    assert dist.Backend.default_device_backend_map[device.type] == backend


def test_an_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="expected 'nccl' or 'gloo'"):
        collective.collective_device("mpi")


class _RecordingPG:
    def __init__(self):
        self.tensors = []

    def broadcast(self, t, root):
        self.tensors.append(t)
        raise AssertionError("a wrong-device tensor reached the collective")


def test_an_nccl_group_refuses_a_cpu_tensor_before_it_reaches_the_collective():
    group = object.__new__(collective.Group)
    group.backend, group.device, group.pg = "nccl", collective.collective_device("nccl"), _RecordingPG()
    group.rank, group.world, group.timeout_s = 0, 2, 1.0
    with pytest.raises(ValueError, match="cpu tensor; the nccl group takes cuda tensors"):
        group.broadcast(torch.zeros(2), "header")
    assert group.pg.tensors == []


def _tensor_calls_without_device(fn) -> list[str]:
    """torch.tensor/zeros/empty/ones/full calls in `fn` that do not say device=."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch" \
                and node.func.attr in ("tensor", "zeros", "empty", "ones", "full", "arange"):
            if not any(k.arg == "device" for k in node.keywords):
                bad.append(f"line {node.lineno}: torch.{node.func.attr}")
    return bad


def test_the_detector_finds_a_tensor_made_without_a_device():
    def made_on_cpu(group):
        return torch.zeros(2, dtype=torch.int64)

    assert _tensor_calls_without_device(made_on_cpu) == ["line 2: torch.zeros"]


@pytest.mark.parametrize("fn", [collective.send, collective.receive], ids=["send", "receive"])
def test_every_tensor_the_sync_protocol_makes_is_made_on_the_groups_device(fn):
    assert _tensor_calls_without_device(fn) == []


def test_the_nccl_group_is_built_with_cleanup_only_error_handling_and_the_setting_put_back(monkeypatch):
    seen = {}

    class FakeNCCL:
        class Options:
            _timeout = None

        def __init__(self, store, rank, world, opts):
            seen["mode"] = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")

    monkeypatch.setattr(dist, "ProcessGroupNCCL", FakeNCCL, raising=False)
    monkeypatch.setattr(dist, "TCPStore", lambda *a, **k: object())
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # what torchrun sets for its workers
    group = collective.Group("127.0.0.1", 1, 0, 2, timeout_s=5.0, backend="nccl")
    assert seen["mode"] == collective.NCCL_ERROR_HANDLING == "2"  # CleanUpOnly: raise in wait, keep the process
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"  # the training group's setting is untouched
    assert group.device.type == "cuda"
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING")
    collective.Group("127.0.0.1", 1, 0, 2, timeout_s=5.0, backend="nccl")
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in os.environ


class _FailingPG:
    """A process group whose broadcast raises in the call itself, as NCCL does for "Duplicate GPU detected"
    (two ranks of the group on one GPU) while it sets up its communicators."""

    def __init__(self, error: Exception):
        self.error = error

    def broadcast(self, t, root):
        raise self.error


class _BlockedPG:
    """A process group whose broadcast never returns, as NCCL's first one when a peer never connects."""

    def __init__(self):
        self.release = __import__("threading").Event()

    def broadcast(self, t, root):
        self.release.wait()
        raise RuntimeError("released")


def _gloo_group(pg, timeout_s: float = 60.0) -> collective.Group:
    """timeout_s: long where the broadcast ends by itself (the first one's thread is joined that long at most:
    a loaded machine may take more than a fraction of a second to run it), short where it never ends."""
    group = object.__new__(collective.Group)
    group.backend, group.device, group.pg = "gloo", torch.device("cpu"), pg
    group.rank, group.world, group.timeout_s = 0, 2, timeout_s
    return group


@pytest.mark.parametrize("connected", [False, True], ids=["first", "later"])
def test_a_broadcast_that_raises_inside_the_process_group_is_a_weight_sync_error(connected):
    group = _gloo_group(_FailingPG(dist.DistBackendError("NCCL error: invalid usage, Duplicate GPU detected")))
    group._connected = connected
    with pytest.raises(collective.WeightSyncError, match="header failed .*Duplicate GPU detected"):
        group.broadcast(torch.zeros(2, dtype=torch.int64), "header")


def test_the_first_broadcast_gives_up_after_the_timeout_when_a_peer_never_connects():
    pg = _BlockedPG()
    try:
        with pytest.raises(collective.WeightSyncError, match="first broadcast, did not finish in 0s .*never connected"):
            _gloo_group(pg, timeout_s=0.5).broadcast(torch.zeros(2, dtype=torch.int64), "header")
    finally:
        pg.release.set()


def test_a_learner_whose_broadcast_raises_falls_back_to_zeromq_and_stays_alive():
    """LearnerSync.send answers False (the learner then serves that version over ZeroMQ) and leaves the
    collective for good, where the broadcast outside its `try` would have raised into the learner's loop."""
    sync = object.__new__(collective.LearnerSync)
    sync.failed, sync.syncs, sync.sync_s = None, 0, 0.0
    sync.group = _gloo_group(_FailingPG(dist.DistBackendError("NCCL error: Duplicate GPU detected")))
    state = {"w": torch.ones(3)}
    sync.plan = collective.plan(state, 1 << 20)
    assert sync.send(1, state) is False
    assert not sync.ready and "Duplicate GPU detected" in sync.report()["failed"]


def _reference_checksum(flat: torch.Tensor) -> float:
    """The checksum's definition, written whole (what it computed before it was taken in slices)."""
    x = flat.double()
    w = torch.arange(1, x.numel() + 1, dtype=torch.float64).remainder_(1009).add_(1)
    return float((x * w).sum())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_sliced_checksum_is_the_whole_ones_value_and_still_order_sensitive(dtype):
    g = torch.Generator().manual_seed(0)
    flat = torch.randn(2 * checksums._SLICE + 12_345, generator=g).to(dtype)  # three slices, the last partial
    assert checksums.checksum(flat) == pytest.approx(_reference_checksum(flat), rel=1e-12)
    swapped = flat.clone()
    swapped[[7, checksums._SLICE + 3]] = swapped[[checksums._SLICE + 3, 7]]
    assert checksums.checksum(swapped) != pytest.approx(checksums.checksum(flat), rel=1e-12)


def test_the_checksum_of_a_bucket_needs_a_small_fraction_of_the_buckets_size_beyond_it():
    """Peak RSS growth of a fresh process while it checksums a 128 MiB float32 bucket: the whole-bucket
    float64 version grew by 24 B per element (768 MiB here); slice by slice it grew by 0 to 40 MiB in
    repeated runs (the allocator's and thread pools' own noise), bounded here by half the bucket."""
    import subprocess
    import sys

    # Warmed up on a few slices first: the first passes also set up the BLAS library's own buffers.
    code = ("import resource, torch\nfrom streamrl.comm.weights.checksums import checksum, _SLICE\n"
            "flat = torch.randn(32 << 20); checksum(flat[:3 * _SLICE])\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\nchecksum(flat)\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)")
    grown_kib = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert grown_kib * 1024 < (128 << 20) // 2, f"{grown_kib} KiB"
