"""Fixtures for tests that start real streamrl processes on loopback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from procs import FREE_PORTS, REPO, streamrl


@pytest.fixture
def run_job(tmp_path):
    """run_job(*overrides, name=...) → run directory of a finished `streamrl run` on the tiny default."""

    def go(*overrides: str, name: str = "job", timeout: float = 300) -> Path:
        streamrl("run", str(REPO / "configs" / "tiny.yaml"), f"name={name}", f"run_dir={tmp_path / 'runs'}",
                 *FREE_PORTS, *overrides, cwd=tmp_path, timeout=timeout)
        return tmp_path / "runs" / name

    return go


@pytest.fixture(scope="session", autouse=True)
def deepspeed_ops_built():
    """DeepSpeed compiles its CPU shared-memory comm op the first time a learner initialises (30 s to minutes on
    2 busy cores, cached afterwards). Built once here, before any test starts processes, so no test's start-up
    deadline includes a compile (and actors do not give up on a learner that is still compiling)."""
    subprocess.run([sys.executable, "-c", "from deepspeed.comm.torch import build_shm_op; build_shm_op()"],
                   capture_output=True, timeout=900, check=True)
