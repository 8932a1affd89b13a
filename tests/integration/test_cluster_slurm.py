"""Slurm across the simulated cluster (.ci/netns_slurm.sh): Debian's slurm-wlm with slurmctld on node 0 and one
slurmd on each of three network namespaces, the tiny job submitted through configs/cluster/submit.sh as a user
would (from node 0, one learner node and two actor nodes, CurveZMQ keys): the learner's job lands on one node, the
actors' on the other two, the actors find the learner by the host name its job publishes, and the run finishes
balanced.

Opt-in (root; ~1 min): STREAMRL_CLUSTER=1 pytest -q -m cluster tests/integration/test_cluster_slurm.py. Skips
saying why where namespaces or slurm-wlm are missing, unless STREAMRL_REQUIRE_NETNS=1 (CI), where that fails."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import REPO, metrics, streamrl, summary

REQUIRE = os.environ.get("STREAMRL_REQUIRE_NETNS") == "1"
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300),
              pytest.mark.skipif(os.environ.get("STREAMRL_CLUSTER") != "1" and not REQUIRE,
                                 reason="opt-in: STREAMRL_CLUSTER=1 (as root: network namespaces)")]
SCRIPT = REPO / ".ci" / "netns_slurm.sh"
SUBMIT = REPO / "configs" / "cluster" / "submit.sh"
STEPS = 40
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE"}


class SlurmCluster:
    def __init__(self, prefix: str):
        self.prefix = prefix
        self.env = {**os.environ, "STREAMRL_NETNS_PREFIX": prefix}
        self.conf = f"/run/streamrl-slurm-{prefix}/slurm.conf"

    def on(self, node: int, args: list[str], cwd: Path | None = None, timeout: float = 60) -> str:
        """ARGS on node `node` (its network, host name and /etc/hosts), with this cluster's SLURM_CONF."""
        pid = Path(f"/run/streamrl-slurm-{self.prefix}/node-{node}.pid").read_text().strip()
        done = subprocess.run(["nsenter", "--target", pid, "--net", "--uts", "--mount",
                               *([f"--wd={cwd}"] if cwd else []), "env", f"SLURM_CONF={self.conf}", *args],
                              env=self.env, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def job(self, job: str) -> dict:
        out = self.on(0, ["scontrol", "show", "job", job])
        return {k: m[1] if (m := re.search(rf"(?:^|\s){k}=(\S*)", out)) else "" for k in ("JobState", "ExitCode", "NodeList")}

    def hosts(self, nodelist: str) -> list[str]:
        return self.on(0, ["scontrol", "show", "hostnames", nodelist]).split()


@pytest.fixture(scope="module")
def slurm():
    c = SlurmCluster(f"srs{os.getpid() % 100000}")
    why = None
    if os.geteuid() != 0:
        why = "network namespaces need root"
    elif shutil.which("nsenter") is None or shutil.which("unshare") is None:
        why = "no nsenter/unshare (util-linux)"
    else:
        done = subprocess.run([str(SCRIPT), "start"], env=c.env, capture_output=True, text=True, timeout=240)
        if done.returncode != 0:
            why = f".ci/netns_slurm.sh start failed (exit {done.returncode}): {done.stderr[-3000:]}"
            subprocess.run([str(SCRIPT), "stop"], env=c.env, capture_output=True, timeout=120)
    if why:
        if REQUIRE:
            pytest.fail(f"{why} (STREAMRL_REQUIRE_NETNS=1)")
        pytest.skip(why)
    try:
        yield c
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=c.env, capture_output=True, timeout=120)


def test_submit_sh_puts_the_learner_on_one_namespace_node_and_the_actors_on_the_others_and_the_run_balances(
        slurm, tmp_path):
    bin_dir = tmp_path / "bin"  # the jobs run this test's Python, as an activated environment would
    bin_dir.mkdir()
    for name, module in (("streamrl", "streamrl"), ("torchrun", "torch.distributed.run")):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {module} "$@"\n')
        (bin_dir / name).chmod(0o755)
    streamrl("keys", str(tmp_path / "keys"), "--actors", "2", cwd=tmp_path)
    env = [f"PATH={bin_dir}:{os.environ['PATH']}", f"PYTHON={sys.executable}", "PYTHONUNBUFFERED=1",
           "LEARNER_POLL_S=0.5", "SBATCH_TIMELIMIT=10"]  # minutes: nothing stuck holds a node
    # As a user would, from the login node (node 0): whole nodes (the scripts' --exclusive), so the learner's job
    # and the actors' cannot share one. Ports are the defaults: every node has its own network.
    out = slurm.on(0, [*env, "bash", str(SUBMIT), "--learner-nodes", "1", "--actor-nodes", "2", "--gpus-per-node", "1",
                       "--cpus-per-node", "1", str(REPO / "configs" / "tiny.yaml"), "name=slurm", f"steps={STEPS}",
                       "transport.host=0.0.0.0", f"transport.curve_keys={tmp_path / 'keys'}",
                       "transport.weights_delta=on"], cwd=tmp_path)
    learner, actors = re.findall(r"(?:learner|actors) job (\d+)", out.splitlines()[0])
    t0 = time.monotonic()
    while {slurm.job(j)["JobState"] for j in (learner, actors)} - ENDED:  # a stuck job ends with the nodes (fixture)
        assert time.monotonic() - t0 < 240, f"jobs still {[slurm.job(j) for j in (learner, actors)]}"
        time.sleep(1)
    took = time.monotonic() - t0
    logs = tmp_path / "logs"
    said = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in sorted(logs.glob("*.out")))
    jl, ja = slurm.job(learner), slurm.job(actors)
    assert (jl["JobState"], jl["ExitCode"], ja["JobState"], ja["ExitCode"]) == ("COMPLETED", "0:0", "COMPLETED",
                                                                                "0:0"), said
    learner_nodes, actor_nodes = slurm.hosts(jl["NodeList"]), slurm.hosts(ja["NodeList"])
    assert len(learner_nodes) == 1 and len(actor_nodes) == 2 and not set(learner_nodes) & set(actor_nodes), said
    nodes = {f"{slurm.prefix}n{i}" for i in range(3)}
    assert set(learner_nodes) | set(actor_nodes) == nodes  # one slurmd per namespace, each given work

    run = tmp_path / "runs" / "slurm"
    s, r = summary(run), summary(run)["reconciliation"]
    print(f"\nSLURM netns: learner job {learner} on {learner_nodes}, actors job {actors} on {actor_nodes}; "
          f"{s['steps']} steps, both jobs COMPLETED {took:.0f}s after submission; sessions {r['actor_sessions']}, "
          f"received/used/dropped {s['groups_received']}/{s['groups_used']}/{s['groups_dropped']}, "
          f"balanced {r['balanced']}")
    assert s["status"] == "finished" and s["steps"] == STEPS and len(metrics(run)) == STEPS
    assert r["balanced"] and r["lost_in_transit"] == 0 and r["actor_sessions"] == 2 and not r["unreported_sessions"]
    assert all(session["reported"] and session["received"] > 0 for session in r["sessions"].values())
    actors_out = (logs / f"streamrl-actors-{actors}.out").read_text()
    assert f"-> learner {learner_nodes[0]}" in actors_out  # found by the host name the learner's job published
    assert "actor-0: done" in actors_out and "actor-1: done" in actors_out
