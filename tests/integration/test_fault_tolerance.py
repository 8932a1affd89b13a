"""Processes die and come back; every group stays accounted for; resume picks a complete checkpoint."""

from __future__ import annotations

import ast
import json
import re
import shutil
import signal
import time

import pytest
from procs import (REPO, free_ports, metrics, reaped, rss_mb, spawn, steps_done, streamrl, summary, wait_started,
                   wait_steps)

pytestmark = pytest.mark.slow
TINY = str(REPO / "configs" / "tiny.yaml")


def _args(tmp, name: str, steps: int) -> list[str]:
    group, weights, requests = free_ports(3)
    return [TINY, f"name={name}", f"run_dir={tmp / 'runs'}", f"steps={steps}", f"transport.group_port={group}",
            f"transport.weights_port={weights}", f"transport.weights_request_port={requests}",
            "monitoring.learner_port=0", "monitoring.actor_port=0"]



def _final_stats(log) -> dict:
    """The actor's last log line: `actor-i: done {stats}`."""
    line = [x for x in log.read_text().splitlines() if ": done {" in x][-1]
    return ast.literal_eval(line.split(": done ", 1)[1])


@pytest.mark.long
def test_an_actor_killed_and_restarted_mid_run_leaves_every_group_accounted_for(tmp_path):
    args = _args(tmp_path, "restart", steps=100_000)
    run = tmp_path / "runs" / "restart"
    learner = spawn(["learner", *args], tmp_path / "learner.log")
    actors = [spawn(["actor", *args, "--index", str(i)], tmp_path / f"actor-{i}.log") for i in range(2)]
    with reaped(learner, actors):
        wait_started(tmp_path / "actor-1.log", learner, actors[1])  # a late start would leave it no session to count
        wait_steps(run, max(20, steps_done(run) + 5), learner)
        actors[1].send_signal(signal.SIGKILL)
        actors[1].wait()
        wait_steps(run, 40, learner)
        again = tmp_path / "actor-1-again.log"
        actors.append(spawn(["actor", *args, "--index", "1"], again))
        # The learner trains on until the restarted actor has joined and worked beside it for 10 steps (a
        # fixed step count raced the new process's start-up), then stops as Ctrl-C stops it.
        wait_started(again, actors[2], timeout=240)
        wait_steps(run, len(metrics(run)) + 10, learner)
        learner.send_signal(signal.SIGTERM)
        assert learner.wait(timeout=240) == 0
        for a in (actors[0], actors[2]):
            assert a.wait(timeout=30) == 0
    s = summary(run)
    r = s["reconciliation"]
    assert s["steps"] == len(metrics(run)) > 50 and r["actor_sessions"] == 3 and r["balanced"]
    assert r["lost_in_transit"] == 0
    assert s["groups_received"] == s["groups_used"] + sum(s["groups_dropped"].values())
    survivors = [_final_stats(tmp_path / "actor-0.log"), _final_stats(tmp_path / "actor-1-again.log")]
    assert all(a["reported"] for a in survivors)
    killed = r["unreported_sessions"]
    assert len(killed) == 1 and killed[0].startswith("actor-1/")
    # What each survivor says it sent is exactly what the learner received from that session.
    for name, a in zip(("actor-0", "actor-1"), survivors):
        seen = r["sessions"][f"{name}/{a['session']}"]
        assert seen == {"sent": a["groups_sent"], "received": a["groups_sent"], "reported": True}


@pytest.mark.long
def test_resume_skips_half_written_and_damaged_checkpoints_and_restores_step_and_version(tmp_path):
    args = _args(tmp_path, "resume", steps=6)
    run = tmp_path / "runs" / "resume"
    learner = spawn(["learner", *args, "learner.checkpoint_every=3"], tmp_path / "learner.log")
    actors = [spawn(["actor", *args, "--index", str(i)], tmp_path / f"actor-{i}.log") for i in range(2)]
    with reaped(learner, actors):
        assert learner.wait(timeout=240) == 0
    ckpt = run / "checkpoints"
    assert (ckpt / "latest").read_text() == "step-6"
    # A crash mid-save: DeepSpeed's files for a newer tag are there, streamrl's state file is not,
    # and the pointer was torn.
    shutil.copytree(ckpt / "step-6", ckpt / "step-9")
    (ckpt / "step-9" / "streamrl.json").unlink()
    (ckpt / "latest").write_text("")
    # And the newest complete one is damaged: its policy weights were cut short (a full disk, a bad copy).
    policy = ckpt / "step-6" / "policy.safetensors"
    policy.write_bytes(policy.read_bytes()[:1000])
    args2 = _args(tmp_path, "resume", steps=8) + ["learner.resume=true"]
    learner = spawn(["learner", *args2], tmp_path / "learner2.log")
    actors = [spawn(["actor", *args2, "--index", str(i)], tmp_path / f"actor2-{i}.log") for i in range(2)]
    with reaped(learner, actors):
        assert learner.wait(timeout=240) == 0
    log = (tmp_path / "learner2.log").read_text()
    assert "using step-6, the newest complete one" in log and f"skipping step-6: {policy}: truncated" in log
    assert re.search(r"resumed from .*step-3", log)  # the previous complete checkpoint, checked and loaded
    recs = metrics(run)
    assert [r["step"] for r in recs] == list(range(8)) and recs[-1]["learner_version"] == 8
    s = summary(run)
    assert s["learner_version"] == 8 and s["steps"] == 8  # the summary covers the whole run, not the last leg
    state = json.loads((ckpt / "step-8" / "streamrl.json").read_text())
    assert state["step"] == 8 and state["version"] == 8 and set(state["rng"]) == {"python", "numpy", "torch", "cuda"}



@pytest.mark.long
def test_a_training_learner_fuzzed_with_ten_thousand_malformed_messages_counts_each_and_keeps_stepping(tmp_path):
    import random

    from fakes import malformed
    import zmq

    # ZeroMQ queues fairly between connections: while the learner fills a batch it takes one message from each
    # connection with one waiting, so from a single fuzzing connection beside the actor's it takes about one
    # malformed message per group (16 per step: 625 steps for 10,000, a minute). Ten fuzzing connections take
    # ten per group, the same messages interleaved with training, in a tenth of the steps. One actor: the
    # learner waits for groups more often and spends that wait rejecting.
    args = _args(tmp_path, "fuzzed", steps=100_000) + ["actors.num=1"]
    group_port, request_port = int(args[4].split("=")[1]), int(args[6].split("=")[1])
    run = tmp_path / "runs" / "fuzzed"
    learner = spawn(["learner", *args], tmp_path / "learner.log")
    actors = [spawn(["actor", *args, "--index", "0"], tmp_path / "actor-0.log")]
    with reaped(learner, actors):
        wait_steps(run, 10, learner)
        rss_before = rss_mb(learner.pid)
        ctx = zmq.Context()
        pushes, dealer = [ctx.socket(zmq.PUSH) for _ in range(10)], ctx.socket(zmq.DEALER)
        for push in pushes:
            push.connect(f"tcp://127.0.0.1:{group_port}")
        dealer.connect(f"tcp://127.0.0.1:{request_port}")
        rng = random.Random(5)
        for i, (_, frames) in enumerate(malformed.messages(10_000, seed=4)):
            push = pushes[i % len(pushes)]
            push.send_multipart(frames)
            if i % 10 == 0:
                dealer.send_multipart(malformed.messages(1, seed=i)[0][1])
            if i % 100 == 0:
                push.send_multipart(malformed.future_group(rng, group_size=8))
        deadline = time.monotonic() + 180
        while True:
            last = metrics(run)[-1]
            if (sum(last["messages_rejected"].values()) >= 10_000 and
                    sum(last["weight_requests_rejected"].values()) >= 1_000 and
                    last["groups_dropped"].get("future", 0) >= 100):
                break
            assert learner.poll() is None and time.monotonic() < deadline, last
            time.sleep(0.2)
        steps_when_done = last["step"]
        wait_steps(run, steps_when_done + 20, learner)  # and it goes on training
        rss_after = rss_mb(learner.pid)
        learner.send_signal(signal.SIGTERM)
        assert learner.wait(timeout=60) == 0
        for sock in [*pushes, dealer]:
            sock.close(0)
        ctx.term()
    s = summary(run)
    assert sum(s["messages_rejected"].values()) == 10_000 and len(s["messages_rejected"]) >= 12
    assert s["messages_rejected"]["reward_out_of_range"] > 0  # well-formed, finite, off the run's reward scale
    assert sum(s["weight_requests_rejected"].values()) == 1_000
    assert s["groups_dropped"]["future"] == 100
    assert s["reconciliation"]["balanced"]
    assert rss_after - rss_before < 64, f"learner memory grew {rss_after - rss_before:.0f} MB under fuzzing"
    print(f"learner RSS {rss_before:.0f} MB -> {rss_after:.0f} MB over 11,100 malformed messages, all counted by "
          f"step {steps_when_done}")


def test_a_run_with_curve_keys_trains_end_to_end(tmp_path, run_job):
    out = streamrl("keys", str(tmp_path / "keys"), "--actors", "2", cwd=tmp_path).stdout
    assert "transport.curve_keys=" in out
    s = summary(run_job("steps=5", f"transport.curve_keys={tmp_path / 'keys'}", name="curve"))
    assert s["steps"] == 5 and s["peers_refused"] == 0 and s["reconciliation"]["balanced"]


@pytest.mark.long
def test_a_killed_learner_resumes_and_its_actors_resync_by_themselves(tmp_path):
    args = _args(tmp_path, "phoenix", steps=60) + ["learner.checkpoint_every=10"]
    run = tmp_path / "runs" / "phoenix"
    learner = spawn(["learner", *args], tmp_path / "learner.log")
    actors = [spawn(["actor", *args, "--index", str(i)], tmp_path / f"actor-{i}.log") for i in range(2)]
    with reaped(learner, actors):
        wait_steps(run, 25, learner)
        learner.kill()  # no checkpoint, no shutdown notice: the actors are left waiting or blocked
        learner.wait()
        learner = spawn(["learner", *args, "learner.resume=true"], tmp_path / "learner-again.log")
        assert learner.wait(timeout=300) == 0
        assert [a.wait(timeout=30) for a in actors] == [0, 0]  # the new learner's shutdown reached them
    recs = metrics(run)
    assert [r["step"] for r in recs] == list(range(60))
    assert "resumed from" in (tmp_path / "learner-again.log").read_text()
    for i in range(2):
        assert "the learner restarted" in (tmp_path / f"actor-{i}.log").read_text()
    s = summary(run)
    assert s["steps"] == 60 and not s["stopped_early"] and s["reconciliation"]["balanced"]


def test_a_peer_with_valid_frames_cannot_inflate_rewards_replay_groups_or_forge_its_report(tmp_path):
    import zmq

    from streamrl.comm import codec, wire

    args = _args(tmp_path, "liar", steps=100_000) + ["actors.num=1"]
    group_port = int(args[4].split("=")[1])
    run = tmp_path / "runs" / "liar"
    learner = spawn(["learner", *args], tmp_path / "learner.log")
    actors = [spawn(["actor", *args, "--index", "0"], tmp_path / "actor-0.log")]

    def group(seq: int, reward: float) -> list:
        g = codec.ScoredGroup.from_samples(
            prompt_id="p", policy_version=0, actor_id="liar", prompt_tokens=[1, 2], completions=[[3]] * 8,
            logprobs=[[-1.0]] * 8, rewards=[reward] + [0.0] * 7, finish_reasons=["stop"] * 8)
        g.session, g.seq = "replay", seq
        return codec.encode_groups([g])

    with reaped(learner, actors):
        wait_steps(run, 5, learner)
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.connect(f"tcp://127.0.0.1:{group_port}")
        push.send_multipart(group(0, 1e30))  # well-formed and finite, far outside the copy task's [0, 1]
        push.send_multipart(group(1, 3e38))
        push.send_multipart(group(2, 1.0))
        push.send_multipart(group(2, 1.0))  # the same session and sequence number again: a replay
        push.send_multipart(wire.encode(wire.ActorReport(actor_id="liar", session="replay", groups_sent=10**9,
                                                         groups_generated=10**9)))
        deadline = time.monotonic() + 120
        while not (last := metrics(run)[-1])["groups_dropped"].get("duplicate"):
            assert learner.poll() is None and time.monotonic() < deadline, last
            time.sleep(0.2)
        learner.send_signal(signal.SIGTERM)
        assert learner.wait(timeout=120) == 0
        push.close(0)
        ctx.term()
    s = summary(run)
    assert s["messages_rejected"] == {"reward_out_of_range": 2}, s["messages_rejected"]
    assert s["groups_dropped"]["duplicate"] == 1
    assert all(r["reward_mean"] is not None and 0 <= r["reward_mean"] <= 1 for r in metrics(run))  # never trained on
    r = s["reconciliation"]
    assert r["groups_rejected"] == 2 and r["duplicates"] == 1
    assert "liar/replay" in r["contradicted_sessions"] and not r["balanced"], r
    assert r["lost_in_transit"] == 10**9 - 3
