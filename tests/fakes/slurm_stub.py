"""Stand-ins for Slurm and the launchers, for tests/unit/core/test_slurm_scripts.py.

Installed as `sbatch`, `srun`, `scontrol`, `torchrun`, `deepspeed`, `streamrl`, `hostname`, `ssh`,
`pdsh` on a PATH prefix (one small shell wrapper each, all calling this file). Every call appends
one JSON line to $STUB_LOG: the command, its argv, its working directory and its environment.

- `sbatch` prints a job id (1001, 1002, ...; --parsable prints the bare id).
- `srun` starts its command once per task, as Slurm would: --nodes x --ntasks-per-node tasks in
  block order, each with SLURM_NODEID, SLURM_LOCALID, SLURM_PROCID and the node's
  CUDA_VISIBLE_DEVICES (0..SLURM_GPUS_ON_NODE-1) and STUB_NODE (its node's name) set.
- `scontrol show hostnames` prints $STUB_NODES one per line; `scontrol show job ID` prints the
  state in $STUB_STATE_FILE (default PENDING), or fails if it holds UNKNOWN. After $STUB_START_AFTER
  `show job` calls it plays the learner starting: the state becomes RUNNING and $STUB_PUBLISH
  (path=host) is written.
- `torchrun` and `deepspeed` stay up until the file $STUB_HOLD exists, if it is set (a running learner).
- `hostname` prints $STUB_NODE; `ssh` and `pdsh` fail (the scripts must not need them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def record(name: str, argv: list[str]) -> None:
    with open(os.environ["STUB_LOG"], "a") as f:
        f.write(json.dumps({"cmd": name, "argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}) + "\n")


def option(argv: list[str], name: str, default: str | None = None) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


def srun(argv: list[str]) -> int:
    i = 0
    while i < len(argv) and argv[i].startswith("-"):  # options all given as --name=value
        i += 1
    command = argv[i:]
    nodes = int(option(argv, "--nodes", os.environ.get("SLURM_JOB_NUM_NODES", "1")))
    per_node = int(option(argv, "--ntasks-per-node", "1"))
    names = os.environ.get("STUB_NODES", "node-a").split()
    gpus = int(os.environ.get("SLURM_GPUS_ON_NODE", "0"))
    status = 0
    for node in range(nodes):
        for local in range(per_node):
            env = {**os.environ, "SLURM_NODEID": str(node), "SLURM_LOCALID": str(local),
                   "SLURM_PROCID": str(node * per_node + local), "STUB_NODE": names[node],
                   "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(gpus)))}
            status |= subprocess.run(command, env=env).returncode
    return status


def scontrol(argv: list[str]) -> int:
    if argv[:2] == ["show", "hostnames"]:
        print("\n".join(os.environ["STUB_NODES"].split()))
        return 0
    if argv[:2] == ["show", "job"]:
        state_file = Path(os.environ["STUB_STATE_FILE"])
        calls = int(os.environ.get("STUB_START_AFTER", "0"))
        shown = len([line for line in open(os.environ["STUB_LOG"]) if '"scontrol"' in line and '"job"' in line])
        state = state_file.read_text().strip() if state_file.exists() else "PENDING"
        if calls and shown >= calls and state == "PENDING":
            state = "RUNNING"
            state_file.write_text(state)
            path, host = os.environ["STUB_PUBLISH"].split("=")
            Path(path).write_text(host + "\n")
        if state == "UNKNOWN":
            print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
            return 1
        print(f"JobId={argv[2]} JobName=streamrl-learner\n   UserId=u(1) GroupId=g(1)\n"
              f"   JobState={state} Reason=None Dependency=(null)\n   BatchHost=node-a")
        return 0
    return 1


def main() -> int:
    name, argv = sys.argv[1], sys.argv[2:]
    record(name, argv)
    if name == "sbatch":
        n = len([line for line in open(os.environ["STUB_LOG"]) if line.startswith('{"cmd": "sbatch"')])
        print(1000 + n if "--parsable" in argv else f"Submitted batch job {1000 + n}")
        return 0
    if name == "srun":
        return srun(argv)
    if name == "scontrol":
        return scontrol(argv)
    if name == "hostname":
        print(os.environ.get("STUB_NODE", "login"))
        return 0
    if name in ("ssh", "pdsh"):
        return 255
    if name in ("torchrun", "deepspeed") and (hold := os.environ.get("STUB_HOLD")):
        deadline = time.monotonic() + 60
        while not os.path.exists(hold) and time.monotonic() < deadline:
            time.sleep(0.05)
    return 0  # torchrun, deepspeed, streamrl: recorded only


if __name__ == "__main__":
    sys.exit(main())
