"""A run's records are its own (issue 31): one live run per directory, resume only with settings that keep the run
what it is, no silent wait, and a summary.json that tells how the run ended. Real `streamrl run` processes on
loopback, the tiny CPU job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import FREE_PORTS, REPO, metrics, reaped, summary

pytestmark = pytest.mark.slow
TINY = str(REPO / "configs" / "tiny.yaml")
QUIET = ["monitoring.learner_port=0", "monitoring.actor_port=0"]


def _cmd(tmp: Path, *args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamrl", *args], cwd=tmp, capture_output=True, text=True,
                          timeout=timeout, check=False, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def _start(tmp: Path, name: str, *overrides: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "streamrl", "run", TINY, f"name={name}", f"run_dir={tmp / 'runs'}",
                             *FREE_PORTS, *QUIET, *overrides], cwd=tmp, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def _wait_steps(proc: subprocess.Popen, run: Path, n: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not ((run / "metrics.jsonl").exists() and len(metrics(run)) >= n):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{n} steps never came:\n{proc.communicate()[0][-3000:]}")
        time.sleep(0.1)


def _learner_pid(run: Path) -> int:
    """The `streamrl learner` process of the run (started as a fresh interpreter: STREAMRL_FORK=0)."""
    marker = str(run / "config.yaml")
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                argv = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if marker in argv and "learner" in argv:
                return int(d.name)
    raise AssertionError("no learner process found")


def test_a_live_run_refuses_a_second_run_overwrite_and_resume_naming_its_process(tmp_path):
    run = tmp_path / "runs" / "dup"
    first = _start(tmp_path, "dup", "steps=100000", "learner.slow_step_s=0.2")
    with reaped(first):
        _wait_steps(first, run, 2)
        common = [TINY, "name=dup", f"run_dir={tmp_path / 'runs'}", *FREE_PORTS, *QUIET]
        second = _cmd(tmp_path, "run", *common)
        overwrite = _cmd(tmp_path, "run", *common, "--overwrite")
        resume = _cmd(tmp_path, "run", *common, "learner.resume=true")
        alone = _cmd(tmp_path, "learner", *common, "learner.resume=true")
        steps_before = len(metrics(run))
        assert first.poll() is None, "the live run was disturbed"
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=120)
    for what, proc in [("second run", second), ("--overwrite", overwrite), ("resume", resume), ("learner", alone)]:
        assert proc.returncode == 2, (what, proc.stdout, proc.stderr)
        assert f"in use by a live run (pid {first.pid} command" in proc.stderr, (what, proc.stderr)
    assert "--overwrite is refused" in overwrite.stderr and "learner.resume=true is refused" in resume.stderr
    assert not list(run.parent.glob("dup.old-*")), "--overwrite moved the live run aside"
    recs = metrics(run)
    assert [r["step"] for r in recs] == list(range(len(recs))) and len(recs) >= steps_before  # one run's steps
    assert summary(run)["status"] == "stopped"


@pytest.mark.long
def test_a_crashed_runs_lock_goes_with_it(tmp_path):
    run = tmp_path / "runs" / "crash"
    first = _start(tmp_path, "crash", "steps=100000", "learner.slow_step_s=0.2", env={"STREAMRL_FORK": "0"})
    with reaped(first):
        _wait_steps(first, run, 2)
        learner = _learner_pid(run)
        first.kill()  # the supervisor dies at once; its children follow (PR_SET_PDEATHSIG)
        first.wait()
        deadline = time.monotonic() + 120
        while Path(f"/proc/{learner}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    check = _cmd(tmp_path, "check", TINY, "name=crash", f"run_dir={tmp_path / 'runs'}", "learner.resume=true",
                 *FREE_PORTS, *QUIET)
    assert check.returncode == 0, check.stderr


@pytest.mark.long
def test_resume_applies_and_records_a_safe_change_and_refuses_one_that_would_corrupt_the_run(tmp_path):
    run = tmp_path / "runs" / "res"
    common = [TINY, "name=res", f"run_dir={tmp_path / 'runs'}", *FREE_PORTS, *QUIET]
    first = _cmd(tmp_path, "run", *common, "steps=3")
    assert first.returncode == 0, first.stdout + first.stderr
    config_before = (run / "config.yaml").read_bytes()
    log_before = (run / "logs" / "learner.log").read_text()
    for change, key in [("task.name=reverse", "task.name"), ("model.hidden_size=32", "model.hidden_size"),
                        ("advantage.estimator=grpo", "advantage.estimator"), ("reward.bucket_edges=[0.5] advantage.r_min_correct=1.0", "reward.bucket_edges")]:
        refused = _cmd(tmp_path, "run", *common, "steps=5", "learner.resume=true", *change.split())
        assert refused.returncode == 2, (change, refused.stdout, refused.stderr)
        assert "other settings that shape the model, data or rewards" in refused.stderr and key in refused.stderr, \
            refused.stderr
        assert (run / "config.yaml").read_bytes() == config_before, f"{change}: config.yaml overwritten"
    resumed = _cmd(tmp_path, "run", *common, "steps=5", "learner.resume=true", "optim.lr=0.001")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming with changed settings (applied): steps 3 -> 5, optim.lr 0.0003 -> 0.001" in resumed.stderr
    records = [json.loads(line) for line in (run / "resumes.jsonl").read_text().splitlines()]
    assert [r["changes"] for r in records] == [{"steps": [3, 5], "optim.lr": [0.0003, 0.001]}]
    recs = metrics(run)
    assert [r["step"] for r in recs] == [0, 1, 2, 3, 4]
    assert {r["lr"] for r in recs[:3]} == {0.0003} and {r["lr"] for r in recs[3:]} == {0.001}
    log_after = (run / "logs" / "learner.log").read_text()
    assert log_after.startswith(log_before) and log_after.count("--- streamrl learner") == 2


@pytest.mark.long
def test_a_learner_that_cannot_stop_does_not_hold_one_ctrl_c_and_the_wait_is_told(tmp_path):
    run = tmp_path / "runs" / "hang"
    # The supervisor's notes every 2 s instead of 15 and its grace for a frozen learner 4 s instead of 30
    # (short_waits/sitecustomize.py): the same paths, without a minute of waiting.
    short = str(Path(__file__).parent / "short_waits")
    env = {"STREAMRL_FORK": "0", "STREAMRL_TEST_SHORT_WAITS": "2,4",
           "PYTHONPATH": os.pathsep.join(filter(None, [short, os.environ.get("PYTHONPATH")]))}
    proc = _start(tmp_path, "hang", "steps=100000", "learner.slow_step_s=0.2", env=env)
    with reaped(proc):
        _wait_steps(proc, run, 2)
        learner = _learner_pid(run)
        os.kill(learner, signal.SIGSTOP)  # a hung learner: no step, no reaction to SIGTERM
        told = "streamrl: waiting for the next step: the learner waits for groups from the actors"
        lines = []
        while not lines or told not in lines[-1]:  # the supervisor tells what the run waits for
            lines.append(proc.stdout.readline())
            assert lines[-1], "".join(lines)  # the supervisor ended before saying it
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)  # before, it waited for the stopped learner for ever
        out = "".join(lines) + out
    assert "waiting for the learner to stop (it is stopped (SIGSTOP) and cannot" in out, out
    assert "did not stop within 4s; killing it" in out, out
    assert proc.returncode == 130, (proc.returncode, out)
    s = summary(run)
    assert s["status"] == "failed" and "killed by SIGKILL" in s["error"] and s["steps"] == len(metrics(run)), s


@pytest.mark.long
def test_a_learner_killed_by_a_signal_leaves_a_failed_summary(tmp_path):
    run = tmp_path / "runs" / "killed"
    proc = _start(tmp_path, "killed", "steps=100000", "learner.slow_step_s=0.2", env={"STREAMRL_FORK": "0"})
    with reaped(proc):
        _wait_steps(proc, run, 2)
        os.kill(_learner_pid(run), signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "learner was killed by SIGKILL" in out, out
    s = summary(run)
    assert s["status"] == "failed" and "killed by SIGKILL" in s["error"] and s["steps"] == len(metrics(run)), s


def test_streamrl_run_refuses_zero_actors_at_once(tmp_path):
    proc = _cmd(tmp_path, "run", TINY, f"run_dir={tmp_path / 'runs'}", "actors.num=0", *FREE_PORTS, *QUIET,
                timeout=120)  # before, it waited data_timeout_s (300 s) for groups
    assert proc.returncode == 2 and "actors.num=0: `streamrl run` needs at least one actor" in proc.stderr, proc.stderr
    assert not (tmp_path / "runs" / "tiny" / "summary.json").exists()


@pytest.mark.parametrize("name", ["", "../escape", "a/b"])
def test_a_run_name_that_is_not_one_folder_is_refused_before_anything_is_written(tmp_path, name):
    proc = _cmd(tmp_path, "run", TINY, f"name={name}", f"run_dir={tmp_path / 'runs'}", *FREE_PORTS, timeout=120)
    assert proc.returncode == 2 and "must be one folder name" in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "escape").exists()


@pytest.mark.long
@pytest.mark.parametrize("change,key", [("task.name=reverse", "task.name"), ("model.num_heads=2", "model.num_heads"),
                                        ("actors.group_size=4", "actors.group_size")])
def test_an_actor_set_up_for_another_run_is_refused_by_name_and_the_run_goes_on_with_the_others(tmp_path, change, key):
    from procs import free_ports, spawn

    g, w, r = free_ports(3)
    common = [TINY, f"run_dir={tmp_path}", "name=hs", "steps=6", "actors.num=2", "monitoring.learner_port=0",
              "monitoring.actor_port=0", f"transport.group_port={g}", f"transport.weights_port={w}",
              f"transport.weights_request_port={r}"]
    learner = spawn(["learner", *common], tmp_path / "learner.log")
    bad = spawn(["actor", *common, "--index", "1", change], tmp_path / "bad.log")
    good = spawn(["actor", *common, "--index", "0"], tmp_path / "good.log")
    with reaped(learner, bad, good):
        assert bad.wait(timeout=180) == 1, (tmp_path / "bad.log").read_text()[-3000:]
        assert learner.wait(timeout=240) == 0, (tmp_path / "learner.log").read_text()[-3000:]
        assert good.wait(timeout=60) == 0, (tmp_path / "good.log").read_text()[-3000:]
    bad_line = next(line for line in (tmp_path / "bad.log").read_text().splitlines() if "error:" in line)
    assert "the learner refused this actor: its settings differ from the learner's" in bad_line and key in bad_line
    learner_log = (tmp_path / "learner.log").read_text()
    assert f"refused actor-1: its settings differ from the learner's ({key}: learner" in learner_log
    s = summary(tmp_path / "hs")
    assert s["status"] == "finished" and s["weight_requests_rejected"]["fingerprint_mismatch"] >= 1
    assert s["groups_used"] == 6 * 16
