"""Fixtures for tests that start real streamrl processes on loopback."""

from __future__ import annotations

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
