"""streamrl.comm.weight_sync on a machine without NCCL: every collective tensor is made on the device the
group's backend takes, and the NCCL group is built so that a timeout cannot kill the process."""

from __future__ import annotations

import ast
import inspect
import os
import textwrap

import pytest
import torch
import torch.distributed as dist

from streamrl.comm import weight_sync


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_the_collective_device_is_the_one_torch_maps_to_the_backend(backend):
    device = weight_sync.collective_device(backend)
    assert dist.Backend.default_device_backend_map[device.type] == backend


def test_an_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="expected 'nccl' or 'gloo'"):
        weight_sync.collective_device("mpi")


class _RecordingPG:
    def __init__(self):
        self.tensors = []

    def broadcast(self, t, root):
        self.tensors.append(t)
        raise AssertionError("a wrong-device tensor reached the collective")


def test_an_nccl_group_refuses_a_cpu_tensor_before_it_reaches_the_collective():
    group = object.__new__(weight_sync.Group)
    group.backend, group.device, group.pg = "nccl", weight_sync.collective_device("nccl"), _RecordingPG()
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


@pytest.mark.parametrize("fn", [weight_sync.send, weight_sync.receive], ids=["send", "receive"])
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
    group = weight_sync.Group("127.0.0.1", 1, 0, 2, timeout_s=5.0, backend="nccl")
    assert seen["mode"] == weight_sync.NCCL_ERROR_HANDLING == "2"  # CleanUpOnly: raise in wait, keep the process
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"  # the training group's setting is untouched
    assert group.device.type == "cuda"
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING")
    weight_sync.Group("127.0.0.1", 1, 0, 2, timeout_s=5.0, backend="nccl")
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in os.environ
