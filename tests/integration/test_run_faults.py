"""What a user sees when a run meets a full disk or a second Ctrl-C: one line, a trustworthy exit
status, and every complete result kept (issue 18; the other exit statuses: tests/unit/commands/test_launch.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import FREE_PORTS, REPO, metrics, reaped

from streamrl.run import checkpoints

pytestmark = pytest.mark.slow
TINY = str(REPO / "configs" / "tiny.yaml")
QUIET = ["monitoring.learner_port=0", "monitoring.actor_port=0"]


def _run(tmp: Path, run_dir: Path, name: str, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "streamrl", "run", TINY, f"name={name}", f"run_dir={run_dir}",
                             "steps=100000", *FREE_PORTS, *QUIET, *overrides], cwd=tmp, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _wait_for(cond, proc: subprocess.Popen, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{what} never happened:\n{proc.communicate()[0][-3000:]}")
        time.sleep(0.1)


@pytest.fixture
def small_disk(tmp_path):
    """A 24 MiB tmpfs: a disk that can really fill up (needs root and mount rights; CI has both)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.strip() or 'mount failed'}); needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(disk: Path, leave_bytes: int) -> None:
    """Take all but `leave_bytes` of the disk's free space."""
    with open(disk / "hog", "wb") as f:
        while (os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize) > leave_bytes + (1 << 16):
            try:
                f.write(b"\0" * (1 << 16))
                f.flush()
            except OSError:
                break


def test_a_disk_filling_up_mid_run_keeps_the_last_checkpoint_metrics_and_a_failed_summary(tmp_path, small_disk):
    run = small_disk / "full"
    proc = _run(tmp_path, small_disk, "full", "learner.checkpoint_every=5")
    with reaped(proc):
        _wait_for(lambda: (run / "checkpoints" / "step-5" / checkpoints.STATE).exists(), proc, "the step-5 checkpoint")
        _fill(small_disk, leave_bytes=400_000)  # room for metrics lines and logs, not for a 1.4 MB checkpoint
        out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 1, out
    lines = [x for x in out.splitlines() if "disk full" in x]
    assert len(lines) == 1 and "No space left on device" in lines[0] and str(run) in lines[0], out
    assert "Traceback" not in out and "enforce fail" not in out, out
    print(lines[0])
    ckpt = run / "checkpoints"
    newest = checkpoints.newest_complete(ckpt)
    assert newest is not None and checkpoints.problem_with(ckpt / newest[0]) is None
    tags = sorted(p.name for p in ckpt.iterdir() if p.is_dir())
    assert all((ckpt / t / checkpoints.STATE).is_file() for t in tags), f"a partial checkpoint was left: {tags}"
    assert not list(ckpt.rglob("*.tmp"))
    recs = metrics(run)  # every line a whole record
    assert [r["step"] for r in recs] == list(range(len(recs))) and len(recs) >= newest[1]["step"]
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "failed" and "disk full" in s["error"] and s["steps"] == len(recs)


def test_a_second_ctrl_c_kills_the_run_and_exits_130_without_a_log_tail(tmp_path):
    run = tmp_path / "runs" / "twice"
    proc = _run(tmp_path, tmp_path / "runs", "twice", "learner.slow_step_s=0.2")
    with reaped(proc):
        _wait_for(lambda: (run / "metrics.jsonl").exists() and len(metrics(run)) >= 3, proc, "3 steps")
        proc.send_signal(signal.SIGINT)
        # Two signals sent before the supervisor runs are one pending signal: the second goes once the first is
        # handled (it says so), while the learner still finishes its step and checkpoints.
        lines = []
        while not lines or "streamrl: stopping (Ctrl-C again to kill)" not in lines[-1]:
            lines.append(proc.stdout.readline())
            assert lines[-1], "".join(lines)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        out = "".join(lines) + out
    assert proc.returncode == 130, out
    assert "killed the learner and actors" in out and "Traceback" not in out and "status -9" not in out, out


@pytest.mark.parametrize("after_s", [0.5, 1.5, 3.0])
def test_ctrl_c_at_any_moment_of_start_up_stops_the_run_and_its_children_with_a_true_summary(tmp_path, after_s):
    from procs import children_of_run

    run = tmp_path / "runs" / "early"
    proc = _run(tmp_path, tmp_path / "runs", "early")
    with reaped(proc):
        time.sleep(after_s)  # a moment of start-up: imports, the children's spawn, the model, the engine
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        out, _ = proc.communicate(timeout=90)
        took = time.monotonic() - t0
    assert proc.returncode == 130, out
    assert "Traceback" not in out, out
    if "stopped before the run started" in out:  # a loaded machine: the stop came before the run directory
        assert not run.exists() and not children_of_run(run), out
        return
    assert "streamrl: stopping" in out, out
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "stopped" and s["stopped_early"], s
    assert s["steps"] == len(metrics(run)) if (run / "metrics.jsonl").exists() else s["steps"] == 0
    assert s["steps"] < 300, "the run trained on after the stop"
    assert not children_of_run(run), "a child outlived the run"
    assert took < 60, f"{took:.0f}s to stop"
