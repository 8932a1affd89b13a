"""`streamrl bench host-copy` (optional, only when named; root; ~6 min a run pair): whole runs across a simulated
cluster where a weights version takes longer to cross the network than the learner's step, as on a GPU (0.93 s
against 0.25 s at 0.75B on one H200), with each version sent from the parameters (`transport.weights_host_copy=off`)
and from a host copy (`on`), one after the other, at each max_staleness and seed.

The cluster is `.ci/netns_cluster.sh`'s: the learner on node 0 (1 Gbit/s), an actor on each of nodes 1 and 2, their
links shaped to 100 Mbit/s. The model is the tiny job's, widened to 4.2M parameters (17 MB a version: ~1.4 s to
cross a link, against a learner step of ~0.45 s on this machine's cores). Reported per run: the time from the first
learner step to the last, the learner's seconds publishing and waiting for data, the mean lag, groups dropped
stale, versions skipped; and per pair the host copy's time over the one sent from the parameters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "netns_cluster.sh"  # a source checkout's
PREFIX = "srlhc"
WIDE = ["model.hidden_size=256", "model.num_layers=4", "model.intermediate_size=1024"]


def _sh(*args: str) -> None:
    subprocess.run([str(SCRIPT), *args], env={**os.environ, "STREAMRL_NETNS_PREFIX": PREFIX}, check=True,
                   capture_output=True, timeout=120)


def _run(folder: Path, name: str, overrides: list[str]) -> dict:
    """One run, learner and actors on their nodes, to its last step; its record from metrics.jsonl and summary.json."""
    env = {**os.environ, "STREAMRL_NETNS_PREFIX": PREFIX, "PYTHONUNBUFFERED": "1"}
    common = ["tiny.yaml", f"name={name}", f"run_dir={folder}", *WIDE, *overrides]

    def spawn(node: int, args: list[str], log: str) -> subprocess.Popen:
        return subprocess.Popen([str(SCRIPT), "exec", str(node), sys.executable, "-m", "streamrl", *args],
                                stdout=open(folder / log, "w"), stderr=subprocess.STDOUT, env=env)

    learner = spawn(0, ["learner", *common, "transport.host=0.0.0.0"], f"{name}-learner.log")
    actors = [spawn(1 + i, ["actor", *common, "--learner", "10.77.0.1", "--index", str(i)], f"{name}-actor{i}.log")
              for i in range(2)]
    try:
        if learner.wait(timeout=1800) != 0:
            raise RuntimeError(f"bench host-copy: the learner of {name} failed; see {folder / name}-learner.log")
    finally:
        for node in (1, 2):
            _sh("kill", str(node))
        for a in actors:
            a.wait(timeout=60)
    records = [json.loads(line) for line in (folder / name / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((folder / name / "summary.json").read_text())
    total = lambda key: sum(r.get(key) or 0.0 for r in records)  # noqa: E731
    return {"steps": len(records), "first_to_last_s": records[-1]["elapsed_s"] - records[0]["elapsed_s"],
            "publish_s": total("publish_s"), "wait_s": total("wait_s"),
            "lag_mean": sum(r["lag_mean"] for r in records) / len(records),
            "dropped_stale": summary["groups_dropped"].get("stale", 0),
            "skipped": summary.get("weights_versions_skipped", 0)}


def host_copy(short: bool = False, values: list[int] | None = None, seeds: int | None = None,
              steps: int | None = None) -> list[dict]:
    """values: the max_staleness of each pair (default 2 4 8); seeds per value (default 1); steps per run (100)."""
    if os.geteuid() != 0 or not SCRIPT.exists():
        raise RuntimeError("bench host-copy: needs root and .ci/netns_cluster.sh (a checkout), for network namespaces")
    folder = Path(f"/tmp/streamrl-bench-host-copy-{int(time.time())}")
    folder.mkdir(parents=True)
    _sh("start", "3")
    rows = []
    try:
        for node, rate in ((0, "1gbit"), (1, "100mbit"), (2, "100mbit")):
            _sh("rate", str(node), rate)
        for k in values or [2, 4, 8]:
            for seed in range(seeds or 1):
                pair = {}
                for mode in ("off", "on"):
                    pair[mode] = _run(folder, f"ms{k}-s{seed}-{mode}", [
                        f"max_staleness={k}", f"seed={seed}", f"steps={steps or (20 if short else 100)}",
                        f"transport.weights_host_copy={mode}"])
                    rows.append({"bench": "host_copy", "max_staleness": k, "seed": seed, "mode": mode, **pair[mode]})
                rows.append({"bench": "host_copy_pair", "max_staleness": k, "seed": seed,
                             "ratio_on_vs_off": pair["on"]["first_to_last_s"] / pair["off"]["first_to_last_s"]})
    finally:
        _sh("stop")
    return rows
