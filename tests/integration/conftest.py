"""Fixtures for tests that start real streamrl processes on loopback."""

from __future__ import annotations

import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest
from procs import FREE_PORTS, REPO, children_of_run, reaped, streamrl, wait_for_steps


@pytest.fixture
def run_job(tmp_path):
    """run_job(*overrides, name=...) → run directory of a finished `streamrl run` on the tiny default."""

    def go(*overrides: str, name: str = "job", timeout: float = 300) -> Path:
        streamrl("run", str(REPO / "configs" / "tiny.yaml"), f"name={name}", f"run_dir={tmp_path / 'runs'}",
                 *FREE_PORTS, *overrides, cwd=tmp_path, timeout=timeout)
        return tmp_path / "runs" / name

    return go


@pytest.fixture(scope="session")
def interrupted_run(tmp_path_factory) -> types.SimpleNamespace:
    """One `streamrl run` of the tiny default (slowed to ~20 steps/s) that `streamrl eval --live` follows for
    two versions while it trains, then stopped with one Ctrl-C. Two tests read different facts from it
    (test_loop: the Ctrl-C; test_eval: the live evaluation), so it starts its three processes once.

    Fields: run (the run directory), children_before (its processes after 5 steps), live_eval (the
    CompletedProcess of `streamrl eval --live`), returncode and out (of `streamrl run`), children_after."""
    tmp = tmp_path_factory.mktemp("interrupted")
    run = tmp / "runs" / "interrupted"
    proc = subprocess.Popen([sys.executable, "-m", "streamrl", "run", str(REPO / "configs" / "tiny.yaml"),
                             "name=interrupted", f"run_dir={tmp / 'runs'}", "steps=100000", "learner.slow_step_s=0.05",
                             *FREE_PORTS, "monitoring.learner_port=0", "monitoring.actor_port=0"],
                            cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with reaped(proc):
        wait_for_steps(proc, run)
        children_before = children_of_run(run)
        live_eval = streamrl("eval", "--live", str(run), "--watch", "2", "--timeout", "60", "eval.prompts=8",
                             cwd=tmp, check=False)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    return types.SimpleNamespace(run=run, children_before=children_before, live_eval=live_eval,
                                 returncode=proc.returncode, out=out, children_after=children_of_run(run))
