"""Soak (opt-in: STREAMRL_SOAK_S=600 pytest -q -s tests/integration/test_soak.py): actors are killed and
restarted at random for the whole time while the learner trains; its memory must stay flat and every
group must stay accounted for. Figures go to runs/soak-report.json and stdout."""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest
from procs import REPO, free_ports, metrics, reaped, rss_mb, spawn, summary

SOAK_S = float(os.environ.get("STREAMRL_SOAK_S", "0"))
pytestmark = [pytest.mark.soak, pytest.mark.skipif(not SOAK_S, reason="opt-in: set STREAMRL_SOAK_S=<seconds>"),
              pytest.mark.timeout(int(SOAK_S) + 600)]
ACTORS = 3



def test_random_actor_kills_and_restarts_keep_memory_flat_and_every_group_accounted_for(tmp_path):
    group, weights, requests = free_ports(3)
    args = [str(REPO / "configs" / "tiny.yaml"), "name=soak", f"run_dir={tmp_path / 'runs'}", "steps=10000000",
            f"actors.num={ACTORS}", f"transport.group_port={group}", f"transport.weights_port={weights}",
            f"transport.weights_request_port={requests}", "monitoring.learner_port=0", "monitoring.actor_port=0"]
    run = tmp_path / "runs" / "soak"
    rng = random.Random(0)
    learner = spawn(["learner", *args], tmp_path / "learner.log")
    actors = [spawn(["actor", *args, "--index", str(i)], tmp_path / f"actor-{i}-0.log") for i in range(ACTORS)]
    every = list(actors)
    kills = {"SIGKILL": 0, "SIGTERM": 0}
    rss: list[tuple[float, float]] = []
    with reaped(learner, every):
        while not ((run / "metrics.jsonl").exists() and metrics(run)):
            assert learner.poll() is None
            time.sleep(0.5)
        t0 = time.monotonic()
        next_kill, next_sample = t0 + rng.uniform(5, 20), t0
        while (now := time.monotonic()) - t0 < SOAK_S:
            assert learner.poll() is None, "the learner died"
            if now >= next_sample:
                rss.append((now - t0, rss_mb(learner.pid)))
                next_sample = now + 10
            if now >= next_kill:
                i = rng.randrange(ACTORS)
                how = rng.choice(["SIGKILL", "SIGTERM"])
                actors[i].send_signal(getattr(signal, how))
                actors[i].wait(timeout=30)
                kills[how] += 1
                time.sleep(rng.uniform(0.5, 5))
                log = tmp_path / f"actor-{i}-{sum(kills.values())}.log"
                actors[i] = spawn(["actor", *args, "--index", str(i)], log)
                every.append(actors[i])
                next_kill = time.monotonic() + rng.uniform(5, 20)
            time.sleep(0.2)
        learner.send_signal(signal.SIGTERM)
        assert learner.wait(timeout=120) == 0
    s = summary(run)
    r = s["reconciliation"]
    warm = [m for t, m in rss if t >= 60] or [m for _, m in rss]
    report = {
        "seconds": SOAK_S, "steps": s["steps"], "actor_kills": kills, "actor_sessions": r["actor_sessions"],
        "groups_sent_by_actors": r["groups_sent_by_actors"], "groups_received": s["groups_received"],
        "groups_used": s["groups_used"], "groups_dropped": s["groups_dropped"],
        "lost_in_transit": r["lost_in_transit"], "unreported_sessions": len(r["unreported_sessions"]),
        "balanced": r["balanced"], "learner_rss_mb_after_1min": warm[0], "learner_rss_mb_end": warm[-1],
        "learner_rss_mb_max_after_1min": max(warm),
    }
    (REPO / "runs").mkdir(exist_ok=True)
    (REPO / "runs" / "soak-report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    assert r["balanced"] and r["lost_in_transit"] == 0
    reported = [v for v in r["sessions"].values() if v["reported"]]
    assert reported and all(v["sent"] == v["received"] for v in reported)
    assert len(r["unreported_sessions"]) <= kills["SIGKILL"]  # everyone else said goodbye
    assert max(warm) - warm[0] < 50, f"learner memory grew from {warm[0]:.0f} to {max(warm):.0f} MB"
