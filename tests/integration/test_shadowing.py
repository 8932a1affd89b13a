"""A user's own `learner.py` or `actors/` in the working directory never replaces streamrl's processes: they
install as `streamrl.learner` and `streamrl.actors`, so `python -m streamrl …` and fresh child interpreters
(`STREAMRL_FORK=0`) import streamrl's, not the user's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from procs import FREE_PORTS, REPO, metrics, streamrl, summary

pytestmark = pytest.mark.slow

TINY = str(REPO / "configs" / "tiny.yaml")
IMPOSTOR = "import pathlib, sys\npathlib.Path(__file__).with_suffix('.ran').write_text('imported')\nsys.exit(9)\n"


@pytest.fixture
def user_project(tmp_path: Path) -> Path:
    """A project folder with the names an RL project commonly uses, each of which exits 9 if imported."""
    (tmp_path / "learner.py").write_text(IMPOSTOR)
    (tmp_path / "actors").mkdir()
    (tmp_path / "actors" / "__init__.py").write_text(IMPOSTOR)
    (tmp_path / "actors" / "main.py").write_text(IMPOSTOR)
    return tmp_path


def _impostors_ran(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.ran"))


def test_streamrl_run_with_fresh_children_runs_streamrls_learner_and_actors(user_project):
    env_fork = os.environ.get("STREAMRL_FORK")
    os.environ["STREAMRL_FORK"] = "0"
    try:
        streamrl("run", TINY, "steps=3", "name=shadow", "actors.num=1", *FREE_PORTS, "monitoring.learner_port=0",
                 "monitoring.actor_port=0", cwd=user_project, timeout=300)
    finally:
        os.environ.pop("STREAMRL_FORK") if env_fork is None else os.environ.__setitem__("STREAMRL_FORK", env_fork)
    run_dir = user_project / "runs" / "shadow"
    assert summary(run_dir)["status"] == "finished"
    assert len(metrics(run_dir)) == 3
    assert _impostors_ran(user_project) == []


def test_python_m_streamrl_learner_runs_streamrls_learner(user_project):
    run_dir = user_project / "runs" / "alone"
    proc = subprocess.run(
        [sys.executable, "-m", "streamrl", "learner", TINY, "name=alone", f"run_dir={run_dir}", *FREE_PORTS,
         "monitoring.learner_port=0", "learner.data_timeout_s=1"],
        cwd=user_project, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out = proc.stdout + proc.stderr
    assert "learner ready" in out, out[-3000:]
    assert _impostors_ran(user_project) == []
    assert proc.returncode != 9, out[-3000:]
