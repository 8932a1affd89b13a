"""The tiny job through configs/cluster/submit.sh on a real Slurm: Debian's slurm-wlm as a one-node cluster
(`.ci/slurm_cluster.sh start`: munged, slurmctld, slurmd; two `gpu` resources whose device files are links to
/dev/null, so the scripts' --gpus-per-node is scheduled as on a GPU cluster and CPU torch does the work).

The learner and actor jobs start, train and finish; their output is where submit.sh and docs/guides/cluster.md say;
`scancel` of the actor job mid-run is survived as on a cluster: the learner job keeps running and holds its run,
and an actor job submitted with `submit.sh --actors-for <learner job>` rejoins it and the run finishes. The
window for the cancel is made, not hoped for: with its actors gone the learner can take only the few batches
already on the way (the actors' throttle bounds how far ahead they generate), and `learner.slow_step_s` keeps the
remaining steps seconds long, far longer than a cancel takes to land.

Skips where there is no `sbatch`, no controller answers, or the Slurm here is not that one-node cluster (a
user's real cluster gets no jobs from the test suite); under STREAMRL_REQUIRE_SLURM=1 (.ci/run) each of those
is a failure. The multi-node command shapes stay in tests/unit/core/test_slurm_scripts.py (stub Slurm)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import REPO, free_ports, metrics, summary

pytestmark = pytest.mark.slow
SUBMIT = REPO / "configs" / "cluster" / "submit.sh"
CLUSTER_NAME = "streamrl-ci"  # .ci/slurm_cluster.sh's ClusterName
STEPS, CANCEL_AT = 60, 10
SLOW_STEP_S = 0.1  # the learner can train at most ~(STEPS - CANCEL_AT) x this after the cancel: 5 s for it to land
RUNNING = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING"}


def _cluster_or_skip() -> None:
    reason = None
    if shutil.which("sbatch") is None:
        reason = "no sbatch on PATH (a one-node Slurm: .ci/slurm_cluster.sh start, as root)"
    else:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
        config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
        name = re.search(r"^ClusterName\s*=\s*(\S+)", config, re.MULTILINE)
        if "UP" not in ping.stdout:
            said = (ping.stdout.strip() or ping.stderr.strip() or "no answer").splitlines()[0]
            reason = f"sbatch is here but no slurmctld answers ({said}); start one: .ci/slurm_cluster.sh start"
        elif name is None or name[1] != CLUSTER_NAME:
            reason = f"this Slurm is cluster {name[1] if name else '?'}, not {CLUSTER_NAME} " \
                     f"(.ci/slurm_cluster.sh): the test suite submits no jobs to it"
    if reason is None:
        return
    if os.environ.get("STREAMRL_REQUIRE_SLURM") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def _state(job: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"JobState=(\w+)", out)
    return m[1] if m else "UNKNOWN"


def _exit_code(job: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30).stdout
    return re.search(r"\bExitCode=(\S+)", out)[1]


def _wait(until, what: str, logs: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in sorted(logs.glob("*.out")))
            raise AssertionError(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.3)


def _submit(env: dict, cwd: Path, *args: str) -> list[str]:
    """The job ids submit.sh's first line names, in order (learner, actors; or with --actors-for: actors, learner)."""
    done = subprocess.run(["bash", str(SUBMIT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return re.findall(r"(?:learner|actors) job (\d+)", done.stdout.splitlines()[0])


def test_the_tiny_job_runs_through_real_sbatch_and_survives_a_cancelled_actor_job(tmp_path):
    _cluster_or_skip()
    bin_dir = tmp_path / "bin"  # the jobs run this test's Python, as an activated environment would
    bin_dir.mkdir()
    for name, module in (("streamrl", "streamrl"), ("torchrun", "torch.distributed.run")):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {module} "$@"\n')
        (bin_dir / name).chmod(0o755)
    group, weights, requests, master = free_ports(4)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": sys.executable,
           "PYTHONUNBUFFERED": "1", "LEARNER_POLL_S": "0.5", "STREAMRL_MASTER_PORT": str(master),
           # The scripts ask for whole nodes (#SBATCH --exclusive); a one-node cluster has one, so both jobs
           # share it. sbatch's environment overrides a script's #SBATCH lines (and its command line both).
           "SBATCH_EXCLUSIVE": "oversubscribe", "SBATCH_TIMELIMIT": "10"}  # minutes: nothing stuck holds the node
    node = socket.gethostbyname(socket.gethostname())  # what the actors reach through the learner's host file
    options = ("--gpus-per-node", "1", "--cpus-per-node", "1")
    job = (str(REPO / "configs" / "tiny.yaml"), "name=slurm", f"steps={STEPS}", f"learner.slow_step_s={SLOW_STEP_S}",
           f"transport.host={node}", f"transport.group_port={group}", f"transport.weights_port={weights}",
           f"transport.weights_request_port={requests}", "monitoring.learner_port=0", "monitoring.actor_port=0")
    run, logs = tmp_path / "runs" / "slurm", tmp_path / "logs"
    jobs: list[str] = []
    try:
        jobs += _submit(env, tmp_path, *options, *job)
        learner, actors = jobs
        _wait(lambda: (run / "metrics.jsonl").exists() and len(metrics(run)) >= CANCEL_AT
              or _state(learner) not in RUNNING, f"{CANCEL_AT} steps", logs)
        assert _state(learner) == "RUNNING"

        subprocess.run(["scancel", actors], check=True, timeout=30)
        _wait(lambda: _state(actors) not in RUNNING, "the cancelled actor job to end", logs, timeout=60)
        assert _state(actors) == "CANCELLED"
        time.sleep(2)  # the learner, without actors, waits (learner.data_timeout_s) and keeps its run
        assert _state(learner) == "RUNNING" and CANCEL_AT <= len(metrics(run)) < STEPS

        jobs += _submit(env, tmp_path, *options, "--actors-for", learner, *job)
        rejoined, of = jobs[2:]
        assert of == learner
        _wait(lambda: _state(learner) not in RUNNING, "the learner job to finish", logs)
        _wait(lambda: _state(rejoined) not in RUNNING, "the rejoined actor job to finish", logs, timeout=60)
    finally:
        if jobs:
            subprocess.run(["scancel", *jobs], timeout=30)
    assert (_state(learner), _exit_code(learner)) == ("COMPLETED", "0:0")
    assert (_state(rejoined), _exit_code(rejoined)) == ("COMPLETED", "0:0")

    # Trained: every step in metrics.jsonl, the run finished, every group of both actor lives accounted for.
    s = summary(run)
    assert s["status"] == "finished" and s["steps"] == STEPS and len(metrics(run)) == STEPS
    r = s["reconciliation"]
    assert r["balanced"] and r["lost_in_transit"] == 0 and r["actor_sessions"] == 2 and not r["unreported_sessions"]
    assert all(session["reported"] and session["received"] > 0 for session in r["sessions"].values())

    # Slurm's output where submit.sh puts it (logs/streamrl-<role>-<job id>.out, docs/guides/cluster.md).
    learner_out = (logs / f"streamrl-learner-{learner}.out").read_text()
    first, again = ((logs / f"streamrl-actors-{j}.out").read_text() for j in (actors, rejoined))
    assert f"streamrl learner: job {learner} " in learner_out and f"learner done: {{'steps': {STEPS}," in learner_out
    assert f"JOB {actors} ON" in first and "CANCELLED" in first and "actor-0: done" in first  # SIGTERM: a clean stop
    start = re.search(r"actor-0: starting at policy version (\d+)", again)
    assert start and int(start[1]) >= CANCEL_AT and "actor-0: done" in again  # it joined the running learner
    assert not (logs / f"learner-host.{learner}").exists()  # removed when the learner job ended
