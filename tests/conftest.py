"""Fixtures shared by unit and integration tests."""

from __future__ import annotations

import os
import shutil

import pytest


def _require(tool: str) -> str:
    """Path of a Prometheus tool. Skips when it is missing, except under CI (STREAMRL_REQUIRE_PROMETHEUS=1),
    where a missing tool must fail rather than let the monitoring tests pass unseen."""
    path = shutil.which(tool)
    if path is None:
        message = f"{tool} is not installed (apt-get install prometheus)"
        if os.environ.get("STREAMRL_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    return _require("prometheus")


@pytest.fixture(scope="session")
def promtool_bin() -> str:
    return _require("promtool")


def cuda_gpus() -> int:
    """How many CUDA GPUs this machine has, asked without initialising CUDA in this process.

    torch.cuda.is_available() calls cudaGetDeviceCount, which runs cuInit: a vLLM engine that a test
    then starts forks its worker, and the child fails with "CUDA error: initialization error" (and
    vLLM cannot tell, since torch.cuda.is_initialized() stays false). torch.cuda.device_count() asks
    NVML first, which leaves the driver alone; no device node at all needs no question."""
    from streamrl.commands.launch import gpu_devices_present

    if not gpu_devices_present():
        return 0
    import torch

    return torch.cuda.device_count()


def _declared_timeout(item) -> float:
    """The test's own `@pytest.mark.timeout(S)`, or 0."""
    mark = item.get_closest_marker("timeout")
    return float(mark.args[0]) if mark and mark.args and isinstance(mark.args[0], (int, float)) else 0.0


def pytest_collection_modifyitems(config, items):
    """`gpu`-marked tests skip cleanly on a machine without CUDA (and run wherever it is present); `long`-marked
    ones (end-to-end runs of 12 s or more on an idle 2-core machine) skip unless STREAMRL_LONG=1, so the README's `pytest -q` stays within
    its time budget; .ci/run runs them right after it."""
    # .ci/run runs the long tier three at a time: the learning runs (they declare a limit of 900 s, minutes each)
    # start first, so that none of them starts last and ends the tier alone.
    minutes = [item for item in items if _declared_timeout(item) >= 900]
    items[:] = minutes + [item for item in items if _declared_timeout(item) < 900]
    if os.environ.get("STREAMRL_LONG") != "1":
        skip_long = pytest.mark.skip(reason="long end-to-end run: opt-in with STREAMRL_LONG=1 (.ci/run runs it)")
        for item in items:
            if "long" in item.keywords:
                item.add_marker(skip_long)
    if cuda_gpus() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def release_model(tmp_path_factory) -> str:
    """A Qwen3-shaped model folder (streamrl.models.release_model), built once per test session, offline."""
    from streamrl.models import release_model

    return str(release_model.build(tmp_path_factory.mktemp("release-model") / "qwen3-shaped"))
