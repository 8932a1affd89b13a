"""The suite never initialises CUDA in the pytest process: a vLLM engine a GPU test starts forks its
worker, and a child of a process that ran cuInit fails with "CUDA error: initialization error"."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

# tests/conftest.py by its path: with tests/integration collected too, `import conftest` may find the other one
_spec = importlib.util.spec_from_file_location("tests_root_conftest", Path(__file__).resolve().parents[2] / "conftest.py")
conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conftest)


class _Item:
    def __init__(self, gpu: bool):
        self.keywords = {"gpu": True} if gpu else {}
        self.markers = []

    def add_marker(self, marker):
        self.markers.append(marker)

    def get_closest_marker(self, name: str):  # pytest.Item's: none declared here
        return None


def _cuda_build_with_one_gpu(monkeypatch):
    """Make this CPU torch look like a CUDA build on a one-GPU machine whose NVML answers, where any
    call that would initialise the CUDA driver (cudaGetDeviceCount → cuInit) fails the test."""
    def cu_init():
        raise AssertionError("cudaGetDeviceCount called: this initialises CUDA in the pytest process")

    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: True)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: 1)
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", cu_init, raising=False)
    monkeypatch.setattr("streamrl.commands.launch.gpu_devices_present", lambda dev="/dev": True)


def test_collection_asks_for_gpus_without_initialising_cuda(monkeypatch):
    _cuda_build_with_one_gpu(monkeypatch)
    items = [_Item(gpu=True), _Item(gpu=False)]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.markers for i in items] == [[], []]  # one GPU found, through NVML: nothing skipped


def test_gpu_tests_skip_where_no_gpu_device_node_exists(monkeypatch):
    monkeypatch.setattr("streamrl.commands.launch.gpu_devices_present", lambda dev="/dev": False)
    items = [_Item(gpu=True), _Item(gpu=False)]
    conftest.pytest_collection_modifyitems(None, items)
    assert len(items[0].markers) == 1 and items[0].markers[0].kwargs["reason"] == "needs a CUDA GPU"
    assert items[1].markers == []


def test_cuda_is_not_initialised_after_collection():
    assert not torch.cuda.is_initialized()

