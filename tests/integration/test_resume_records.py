"""Resume never destroys a record (issue 41 rows 1, 4, 5): a resume with no checkpoint is refused, the newest
complete checkpoint is found whatever `latest` says, and the run's accounting goes on from the checkpoint's. Real
`streamrl learner` and `streamrl actor` processes on loopback, the tiny CPU job."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from procs import REPO, free_ports, metrics, reaped, spawn, summary

pytestmark = pytest.mark.slow
TINY = str(REPO / "configs" / "tiny.yaml")
BATCH_GROUPS = 16  # configs/tiny.yaml's learner.batch_groups


def _args(tmp, name: str, steps: int) -> list[str]:
    group, weights, requests = free_ports(3)
    return [TINY, f"name={name}", f"run_dir={tmp / 'runs'}", f"steps={steps}", f"transport.group_port={group}",
            f"transport.weights_port={weights}", f"transport.weights_request_port={requests}",
            "monitoring.learner_port=0", "monitoring.actor_port=0"]


def _job(tmp, args: list[str], tag: str) -> None:
    learner = spawn(["learner", *args], tmp / f"learner-{tag}.log")
    actors = [spawn(["actor", *args, "--index", str(i)], tmp / f"actor-{tag}-{i}.log") for i in range(2)]
    with reaped(learner, actors):
        assert learner.wait(timeout=240) == 0, (tmp / f"learner-{tag}.log").read_text()[-3000:]
        assert [a.wait(timeout=60) for a in actors] == [0, 0]


@pytest.mark.long
def test_a_resume_with_no_checkpoint_is_refused_and_overwrite_moves_the_record_aside_whole(tmp_path):
    args = _args(tmp_path, "nockpt", steps=100_000)
    run = tmp_path / "runs" / "nockpt"
    learner = spawn(["learner", *args], tmp_path / "learner.log")
    actors = [spawn(["actor", *args, "--index", str(i)], tmp_path / f"actor-{i}.log") for i in range(2)]
    with reaped(learner, actors):
        deadline = time.monotonic() + 180
        while not ((run / "metrics.jsonl").exists() and len(metrics(run)) >= 5):
            assert learner.poll() is None and time.monotonic() < deadline, "the learner stalled"
            time.sleep(0.1)
        learner.send_signal(signal.SIGKILL)  # the default saves only at the end: no checkpoint exists
        learner.wait()
    before = (run / "metrics.jsonl").read_bytes()
    resume = subprocess.run([sys.executable, "-m", "streamrl", "learner", *args, "learner.resume=true"],
                            capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert resume.returncode == 2, resume.stderr
    [line] = [x for x in resume.stderr.splitlines() if "error:" in x]
    assert "no complete checkpoint" in line and "--overwrite" in line, resume.stderr
    assert (run / "metrics.jsonl").read_bytes() == before, "the refused resume touched the record"
    args = _args(tmp_path, "nockpt", steps=3)
    learner = spawn(["learner", *args, "learner.resume=true", "--overwrite"], tmp_path / "learner-again.log")
    actors = [spawn(["actor", *args, "--index", str(i)], tmp_path / f"actor-again-{i}.log") for i in range(2)]
    with reaped(learner, actors):
        assert learner.wait(timeout=240) == 0, (tmp_path / "learner-again.log").read_text()[-3000:]
    [old] = list(run.parent.glob("nockpt.old-*"))
    assert (old / "metrics.jsonl").read_bytes() == before  # moved aside whole, never cut
    assert [r["step"] for r in metrics(run)] == [0, 1, 2]


@pytest.mark.long
def test_resume_finds_a_checkpoint_newer_than_latest_and_the_summary_counts_the_whole_run(tmp_path):
    run = tmp_path / "runs" / "ptr"
    _job(tmp_path, _args(tmp_path, "ptr", steps=6) + ["learner.checkpoint_every=3"], "first")
    ckpt = run / "checkpoints"
    first = summary(run)
    assert first["groups_used"] == 6 * BATCH_GROUPS
    saved = json.loads((ckpt / "step-6" / "streamrl.json").read_text())["intake"]  # the accounting resumed from
    # Killed after step-6's files were complete but before the pointer moved: latest still names step-3, and the
    # final accounting a learner ending at step-6 writes beside it (accounting.json) was never written.
    (ckpt / "latest").write_text("step-3")
    (run / "accounting.json").unlink()
    _job(tmp_path, _args(tmp_path, "ptr", steps=8) + ["learner.resume=true"], "second")
    log = (tmp_path / "learner-second.log").read_text()
    assert "names step-3, but step-6 is complete and newer" in log and "resumed from" in log, log[-3000:]
    recs = metrics(run)
    assert [r["step"] for r in recs] == list(range(8))
    assert not list(run.glob("metrics.jsonl.before-resume-*")), "no step was redone, so nothing was set aside"
    s = summary(run)
    # The accounting goes on from the checkpoint's: the summary counts the whole run, not the last leg. The base is
    # step-6's own accounting, not the first summary's: the first learner went on receiving (and draining, as
    # lost_at_shutdown) after that checkpoint, and how many came then is timing, which no resume can know of.
    assert s["steps"] == 8 and s["groups_used"] == 8 * BATCH_GROUPS, s
    assert saved["used"] == 6 * BATCH_GROUPS and first["groups_received"] >= saved["receiver"]["received"], saved
    r = s["reconciliation"]
    sessions = {(x["actor"], x["session"]): x for x in json.loads((run / "sessions.json").read_text())}
    restored = {(a, sid): c for a, sid, c in saved["receiver"]["sessions"]}
    assert all(sessions[k]["received"] == c["received"] for k, c in restored.items()), "restored counts overwritten"
    new = sum(x["received"] for k, x in sessions.items() if k not in restored)
    assert new >= 2 * BATCH_GROUPS  # the second leg's groups, every one counted on top of the checkpoint's
    assert s["groups_received"] == saved["receiver"]["received"] + new + r["duplicates"] - saved["receiver"][
        "duplicates"], (s["groups_received"], saved["receiver"]["received"], new)
    assert r["actor_sessions"] == 4 and r["balanced"] and r["lost_in_transit"] == 0, r


@pytest.mark.long
def test_resuming_a_finished_run_keeps_the_first_lifes_sessions_and_counts(tmp_path):
    # The last step is a checkpoint's (checkpoint_every divides steps): the learner saves no other at its end, so
    # what came after that save (its actors' final reports, the groups drained at shutdown) is not in a checkpoint.
    run = tmp_path / "runs" / "again"
    _job(tmp_path, _args(tmp_path, "again", steps=4) + ["learner.checkpoint_every=2"], "first")
    first = summary(run)
    assert first["status"] == "finished" and first["reconciliation"]["unreported_session_count"] == 0, first
    _job(tmp_path, _args(tmp_path, "again", steps=6) + ["learner.checkpoint_every=2", "learner.resume=true"],
         "second")
    s, r = summary(run), summary(run)["reconciliation"]
    assert s["status"] == "finished" and s["steps"] == 6 and s["groups_used"] == 6 * BATCH_GROUPS, s
    kept = {k: r["sessions"][k] for k in first["reconciliation"]["sessions"]}
    assert kept == first["reconciliation"]["sessions"], (kept, first["reconciliation"]["sessions"])  # reported
    for reason, n in first["groups_dropped"].items():  # lost_at_shutdown among them: never forgotten
        assert s["groups_dropped"].get(reason, 0) >= n, (reason, first["groups_dropped"], s["groups_dropped"])
    new = sum(x["received"] for k, x in r["sessions"].items() if k not in kept)
    assert s["groups_received"] == first["groups_received"] + new and new >= 2 * BATCH_GROUPS, (s, first)
    assert r["actor_sessions"] == 4 and r["unreported_session_count"] == 0 and r["balanced"], r


@pytest.mark.long
def test_a_killed_learner_resumed_redoes_its_steps_and_keeps_the_earlier_metrics_aside(tmp_path):
    args = _args(tmp_path, "phoenix", steps=30) + ["learner.checkpoint_every=10"]
    run = tmp_path / "runs" / "phoenix"
    learner = spawn(["learner", *args], tmp_path / "learner.log")
    actors = [spawn(["actor", *args, "--index", str(i)], tmp_path / f"actor-{i}.log") for i in range(2)]
    with reaped(learner, actors):
        deadline = time.monotonic() + 180
        while not ((run / "metrics.jsonl").exists() and len(metrics(run)) >= 14):
            assert learner.poll() is None and time.monotonic() < deadline, "the learner stalled"
            time.sleep(0.1)
        learner.kill()
        learner.wait()
        logged = (run / "metrics.jsonl").read_bytes()
        learner = spawn(["learner", *args, "learner.resume=true"], tmp_path / "learner-again.log")
        assert learner.wait(timeout=300) == 0
        assert [a.wait(timeout=60) for a in actors] == [0, 0]
    [aside] = list(run.glob("metrics.jsonl.before-resume-10-*"))
    assert aside.read_bytes() == logged  # steps 10.. were redone; their first records are kept, not cut
    assert [r["step"] for r in metrics(run)] == list(range(30))
    s = summary(run)
    r = s["reconciliation"]
    assert s["steps"] == 30 and s["groups_used"] == 30 * BATCH_GROUPS, s
    # What the killed learner received after its checkpoint died with it, and is counted as such.
    assert r["lost_in_learner_restart"] > 0 and r["lost_in_transit"] == 0 and r["balanced"], r
    state = json.loads((run / "checkpoints" / "step-30" / "streamrl.json").read_text())
    assert state["intake"]["used"] == 30 * BATCH_GROUPS


def test_a_standalone_learner_on_port_zero_says_the_ports_it_bound_and_an_actor_joins_on_them(tmp_path):
    import re

    args = [TINY, "name=zero", f"run_dir={tmp_path / 'runs'}", "steps=3", "transport.group_port=0",
            "transport.weights_port=0", "transport.weights_request_port=0", "monitoring.learner_port=0",
            "monitoring.actor_port=0"]
    log = tmp_path / "learner.log"
    learner = spawn(["learner", *args], log)
    with reaped(learner):
        deadline = time.monotonic() + 120
        while not (m := re.search(r"group port (\d+), weights port (\d+), weights request port (\d+)",
                                  log.read_text(errors="replace"))):
            assert learner.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        group, weights, requests = (int(p) for p in m.groups())
        assert 0 not in (group, weights, requests) and len({group, weights, requests}) == 3
        ports = [f"transport.group_port={group}", f"transport.weights_port={weights}",
                 f"transport.weights_request_port={requests}"]
        actors = [spawn(["actor", *args, *ports, "--index", str(i)], tmp_path / f"actor-{i}.log") for i in range(2)]
        with reaped(actors):
            assert learner.wait(timeout=240) == 0, log.read_text()[-3000:]
    s = summary(tmp_path / "runs" / "zero")
    assert s["steps"] == 3 and s["reconciliation"]["balanced"]
    sessions = json.loads((tmp_path / "runs" / "zero" / "sessions.json").read_text())
    assert len(sessions) == 2 and all(x["reported"] and x["lost"] == 0 for x in sessions)
