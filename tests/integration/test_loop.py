"""The whole loop with real processes on loopback: learner, actors, garbage, Ctrl-C, resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq
from procs import (FREE_PORTS, REPO, children_of_run, free_ports, metrics, reaped, send_raw, spawn, streamrl, summary,
                   wait_for_steps, wait_started)

pytestmark = pytest.mark.slow
TINY = str(REPO / "configs" / "tiny.yaml")


def _wait_for_text(path: Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in {path} after {timeout}s:\n{path.read_text(errors='replace')[-3000:]}")


GARBAGE = [
    [os.urandom(64)],
    [b""],
    [b"\x81\xa4type\xa4nope"],  # msgpack {"type": "nope"}
    [os.urandom(16), os.urandom(8), os.urandom(8), os.urandom(8)],
    [b"\xc1"],  # a byte msgpack never uses
]


@pytest.mark.long
def test_learner_and_two_actors_on_loopback_advance_versions_reject_garbage_and_stop_cleanly(tmp_path):
    g, w, r = free_ports(3)
    common = [TINY, f"run_dir={tmp_path}", "name=loop", "steps=15", f"transport.group_port={g}",
              f"transport.weights_port={w}", f"transport.weights_request_port={r}"]
    learner = spawn(["learner", *common], tmp_path / "learner.log")
    actors: list[subprocess.Popen] = []
    with reaped(learner, actors):
        _wait_for_text(tmp_path / "learner.log", "learner ready", timeout=180)
        ctx = zmq.Context()
        send_raw(ctx, zmq.PUSH, f"tcp://127.0.0.1:{g}", GARBAGE)
        send_raw(ctx, zmq.DEALER, f"tcp://127.0.0.1:{r}", GARBAGE[:3])
        ctx.term()
        actors.extend(spawn(["actor", *common, "--index", str(i), "--learner", "127.0.0.1"],
                             tmp_path / f"actor-{i}.log") for i in range(2))
        assert learner.wait(timeout=180) == 0, (tmp_path / "learner.log").read_text()[-3000:]
        for i, a in enumerate(actors):  # they leave on the learner's shutdown notice, by themselves
            assert a.wait(timeout=30) == 0, (tmp_path / f"actor-{i}.log").read_text()[-3000:]

    run = tmp_path / "loop"
    recs = metrics(run)
    consumed_versions = [r["step"] - r["lag_mean"] for r in recs]
    assert consumed_versions[-1] > consumed_versions[0] + 5, "actors must follow the learner's new weights"
    s = summary(run)
    assert s["learner_version"] == 15
    assert sum(s["messages_rejected"].values()) == len(GARBAGE)
    assert sum(s["weight_requests_rejected"].values()) == 3
    for i in range(2):
        log = (tmp_path / f"actor-{i}.log").read_text()
        assert "versions_applied" in log and "'groups_sent': 0" not in log


def _start_run(tmp_path: Path, name: str, steps: int) -> tuple[subprocess.Popen, Path]:
    """`streamrl run` in the background, returned once its learner has logged 5 steps."""
    run = tmp_path / "runs" / name
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamrl", "run", TINY, f"steps={steps}", f"name={name}",
         f"run_dir={tmp_path / 'runs'}", *FREE_PORTS], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_steps(proc, run)
    return proc, run


def test_ctrl_c_stops_the_run_cleanly_and_leaves_no_process_behind(interrupted_run):
    r = interrupted_run  # a run stopped by one Ctrl-C (conftest.py; test_eval's live evaluation follows it too)
    assert len(r.children_before) == 3  # learner + 2 actors
    assert r.returncode == 130, r.out  # a script can tell an interrupted run from a finished one (0)
    assert "stopping" in r.out
    s = summary(r.run)
    assert s["stopped_early"] is True and s["steps"] == len(metrics(r.run))
    assert r.children_after == []


def test_a_bad_override_fails_at_once_with_one_clear_line(tmp_path):
    proc = streamrl("run", "advantage.estimator=gpro", cwd=tmp_path, check=False, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "advantage.estimator='gpro'" in lines[0] and "corpo, grpo, static" in lines[0]
    assert not (tmp_path / "runs").exists()


def test_a_lone_actor_keeps_a_learner_planned_for_two_actors_stepping(tmp_path):
    """Fewer live actors than configured slow the first step, then the actor takes a larger share."""
    g, w, r = free_ports(3)
    common = [TINY, f"run_dir={tmp_path}", "name=lone", "steps=20", "actors.num=2", f"transport.group_port={g}",
              f"transport.weights_port={w}", f"transport.weights_request_port={r}"]
    learner = spawn(["learner", *common], tmp_path / "learner.log")
    actor = spawn(["actor", *common, "--index", "0"], tmp_path / "actor.log")
    with reaped(learner, actor):
        assert learner.wait(timeout=180) == 0, (tmp_path / "learner.log").read_text()[-3000:]
        assert actor.wait(timeout=30) == 0, (tmp_path / "actor.log").read_text()[-3000:]
    s = summary(tmp_path / "lone")
    assert s["learner_version"] == 20 and s["groups_used"] == 20 * 16
    assert 1 <= s["demands_sent"] <= 3, "after the first demand the actor should supply whole batches itself"
    assert "'share': 16" in (tmp_path / "actor.log").read_text()


@pytest.mark.long
def test_the_run_goes_on_when_an_actor_dies(tmp_path):
    proc, run = _start_run(tmp_path, "one-down", steps=60)
    with reaped(proc):
        victim = next(pid for pid in children_of_run(run)
                      if b"--index\x001" in (Path("/proc") / str(pid) / "cmdline").read_bytes())
        os.kill(victim, signal.SIGKILL)
        out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    assert "actor-1 was killed by SIGKILL" in out
    s = summary(run)
    assert s["steps"] == 60 and not s["stopped_early"]
    assert s["demands_sent"] >= 1  # the survivor was asked for the dead actor's share
    assert children_of_run(run) == []
    r = s["reconciliation"]  # every group accounted for, the killed actor's included
    assert r["balanced"] and r["lost_in_transit"] == 0
    assert [u.split("/")[0] for u in r["unreported_sessions"]] == ["actor-1"]
    assert s["groups_received"] == s["groups_used"] + sum(s["groups_dropped"].values())


@pytest.mark.long
def test_when_every_actor_dies_the_run_stops_with_an_error_instead_of_hanging(tmp_path):
    proc, run = _start_run(tmp_path, "all-down", steps=100000)
    with reaped(proc):
        for pid in children_of_run(run):
            if b"\x00actor\x00" in (Path("/proc") / str(pid) / "cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3, out  # the launcher's status for "every actor failed" (streamrl run --help)
    assert "every actor failed; stopping the learner" in out
    assert summary(run)["stopped_early"] is True
    assert children_of_run(run) == []


@pytest.mark.long
def test_an_actor_restarted_by_hand_keeps_the_run_alive_when_the_other_started_actor_dies(tmp_path):
    proc, run = _start_run(tmp_path, "by-hand", steps=100000)
    with reaped(proc):
        def actor(i: int) -> int:
            return next(pid for pid in children_of_run(run)
                        if f"--index\x00{i}".encode() in (Path("/proc") / str(pid) / "cmdline").read_bytes())

        os.kill(actor(0), signal.SIGKILL)
        log = tmp_path / "by-hand.log"
        again = spawn(["actor", str(run / "config.yaml"), "--index", "0"], log)
        with reaped(again):
            wait_started(log, again, timeout=120)
            os.kill(actor(1), signal.SIGKILL)  # every actor `streamrl run` started is now dead
            steps = len(metrics(run))
            deadline = time.monotonic() + 90
            while len(metrics(run)) < steps + 30:  # the hand-started actor alone feeds the learner
                assert proc.poll() is None, proc.communicate()[0][-3000:]
                assert time.monotonic() < deadline, "the run stalled"
                time.sleep(0.2)
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=120)
            again.wait(timeout=60)
    assert proc.returncode == 130, out  # stopped by Ctrl-C, not by "every actor failed" (3)
    assert "every actor failed" not in out and "every actor this command started has failed" in out, out
    assert summary(run)["reconciliation"]["actor_sessions"] == 3
