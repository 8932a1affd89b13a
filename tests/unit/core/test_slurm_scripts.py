"""The Slurm scripts of configs/cluster/, run with bash against stub Slurm commands (slurm_stub.py):
what they submit and start, checked option by option, and the launchers' argv parsed by the real
torchrun and DeepSpeed argument parsers. Nothing here has run on a real Slurm cluster."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamrl.run.placement import actor_gpus

REPO = Path(__file__).resolve().parents[3]
CLUSTER = REPO / "configs" / "cluster"
CONFIG = str(CLUSTER / "async-8b.yaml")
STUB = Path(__file__).resolve().parents[2] / "fakes" / "slurm_stub.py"
STUBS = ("sbatch", "srun", "scontrol", "torchrun", "deepspeed", "streamrl", "hostname", "ssh", "pdsh")
NCCL_ERROR_VARS = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT",
                   "NCCL_BLOCKING_WAIT")
FLAGS = {"--parsable", "--exclusive"}  # sbatch options without a value


class Slurm:
    """A stub Slurm on a PATH prefix, and a submit directory `work` to run the scripts from."""

    def __init__(self, root: Path):
        self.bin, self.work, self.log = root / "bin", root / "work", root / "calls.jsonl"
        self.state = root / "learner-state"
        for d in (self.bin, self.work):
            d.mkdir()
        for name in STUBS:
            (self.bin / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STUB}" {name} "$@"\n')
            (self.bin / name).chmod(0o755)

    def env(self, **extra: str) -> dict[str, str]:
        """A clean environment (nothing NCCL-related inherited), the stubs first on PATH."""
        return {"PATH": f"{self.bin}:/usr/bin:/bin", "HOME": str(self.work), "LANG": "C.UTF-8",
                "STUB_LOG": str(self.log), "STUB_STATE_FILE": str(self.state), "STUB_NODES": "node-a",
                "PYTHON": sys.executable, "PYTHONPATH": str(REPO), **extra}

    def bash(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", *args], cwd=self.work, env=self.env(**env), capture_output=True, text=True,
                              timeout=120)

    def calls(self, name: str) -> list[dict]:
        if not self.log.exists():
            return []
        return [c for c in map(json.loads, self.log.read_text().splitlines()) if c["cmd"] == name]

    def job_env(self, submission: dict, job_id: str, nodes: list[str]) -> dict[str, str]:
        """What Slurm puts in a batch script's environment for an sbatch call (its effective options)."""
        opts = submission["options"]
        env = {"SLURM_JOB_ID": job_id, "SLURM_JOB_NUM_NODES": opts["--nodes"], "STUB_NODES": " ".join(nodes),
               "SLURM_JOB_NODELIST": ",".join(nodes), "SLURM_NTASKS_PER_NODE": opts["--ntasks-per-node"],
               "SLURM_CPUS_PER_TASK": opts["--cpus-per-task"], "SLURM_GPUS_ON_NODE": opts["--gpus-per-node"],
               "SLURM_SUBMIT_DIR": str(self.work)}
        for item in opts.get("--export", "ALL").split(",")[1:]:
            key, value = item.split("=", 1)
            env[key] = value
        return env


def sbatch_options(call: dict) -> dict:
    """An sbatch call's effective options: the script's #SBATCH lines, then the command line's (which win),
    plus the script and its arguments."""
    argv, cmdline, i = call["argv"], {}, 0
    while argv[i].startswith("--"):
        if "=" in argv[i]:
            key, value = argv[i].split("=", 1)
            i += 1
        elif argv[i] in FLAGS:
            key, value = argv[i], ""
            i += 1
        else:
            key, value = argv[i], argv[i + 1]
            i += 2
        cmdline[key] = value
    script = Path(call["cwd"], argv[i])
    options = {}
    for line in script.read_text().splitlines():
        if m := re.match(r"#SBATCH (--[a-z-]+)(?:=(\S+))?", line):
            options[m[1]] = m[2] or ""
        elif line and not line.startswith("#"):
            break  # sbatch reads #SBATCH lines only before the first command
    return {"options": {**options, **cmdline}, "script": script, "args": argv[i + 1:]}


def srun_options(call: dict) -> dict[str, str]:
    return dict(a.split("=", 1) for a in call["argv"] if a.startswith("--") and "=" in a)


def assert_no_nccl_error_handling_set(calls: list[dict]) -> None:
    for c in calls:
        assert not set(NCCL_ERROR_VARS) & set(c["env"]), f"{c['cmd']} got an NCCL error-handling variable"


@pytest.fixture
def slurm(tmp_path):
    return Slurm(tmp_path)


def torchrun_args(argv: list[str]):
    from torch.distributed.run import get_args_parser

    return get_args_parser().parse_args(argv)


def test_every_sbatch_script_asks_for_memory_cpus_gpus_and_an_output_file_in_an_existing_folder():
    for script in CLUSTER.glob("*.sbatch"):
        opts = sbatch_options({"argv": [script.name], "cwd": str(CLUSTER)})["options"]
        assert opts["--mem"] == "0" and int(opts["--cpus-per-task"]) > 0 and int(opts["--gpus-per-node"]) > 0
        # Slurm opens --output before the script runs (before 23.02 a missing folder fails the job):
        # the default is a file in the submit directory, which exists wherever sbatch is run.
        assert "/" not in opts["--output"], script.name
    for script in CLUSTER.iterdir():  # the launchers' NCCL error handling is left to streamrl (docs/guides/cluster.md)
        assert not any(v in script.read_text() for v in NCCL_ERROR_VARS), script.name


def test_submit_then_learner_and_actors_jobs_start_every_process_where_it_belongs(slurm):
    nodes_l, nodes_a = ["node-a", "node-b"], ["node-c", "node-d"]
    usage = slurm.bash(str(CLUSTER / "submit.sh"))
    assert usage.returncode == 2 and usage.stderr.startswith("One command") and "set -e" not in usage.stderr
    bad = slurm.bash(str(CLUSTER / "submit.sh"), CONFIG, "actors.no_such_key=1")
    assert bad.returncode != 0 and "no_such_key" in bad.stderr and not slurm.calls("sbatch")

    submit = (str(CLUSTER / "submit.sh"), "--learner-nodes", "2", "--actor-nodes", "2", CONFIG,
              "actors.tensor_parallel_size=2")
    no_keys = slurm.bash(*submit)  # the config authenticates actors: 8 need keys
    assert no_keys.returncode != 0 and "streamrl keys keys/ --actors 8" in no_keys.stderr
    (slurm.work / "keys").mkdir()
    for i in range(8):
        (slurm.work / "keys" / f"actor-{i}.key_secret").touch()
    done = slurm.bash(*submit)
    assert done.returncode == 0, done.stderr
    assert "learner job 1001" in done.stdout and "actors job 1002" in done.stdout
    learner, actors = (sbatch_options(c) for c in slurm.calls("sbatch"))
    logs = slurm.work / "logs"
    assert learner["script"].name == "learner.sbatch" and actors["script"].name == "actors.sbatch"
    for sub in (learner, actors):
        assert sub["options"]["--mem"] == "0"
        out = Path(sub["options"]["--output"])
        assert out.parent == logs and out.parent.is_dir()  # created before sbatch ran
    assert learner["options"]["--nodes"] == "2" and learner["options"]["--cpus-per-task"] == "32"
    assert learner["args"] == [CONFIG, "actors.tensor_parallel_size=2", "actors.num=8"]
    # Actors start only once the learner job has (never while it is queued), 4 per node (8 GPUs / tp 2).
    assert actors["options"]["--dependency"] == "after:1001"
    assert (actors["options"]["--nodes"], actors["options"]["--ntasks-per-node"],
            actors["options"]["--cpus-per-task"]) == ("2", "4", "8")
    assert "LEARNER_JOB=1001" in actors["options"]["--export"]

    # The learner job runs (its torchrun stubs stay up until released), then the actors job.
    release = slurm.work / "release"
    learner_job = subprocess.Popen(["bash", str(learner["script"]), *learner["args"]], cwd=slurm.work,
                                   env=slurm.env(**slurm.job_env(learner, "1001", nodes_l), STUB_HOLD=str(release)),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        host_file = logs / "learner-host.1001"
        deadline = time.monotonic() + 60
        while not host_file.exists() and learner_job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host_file.read_text().strip() == "node-a"  # rank 0's node, written once the job runs
        slurm.state.write_text("RUNNING")  # what scontrol now says of job 1001
        actor_job = slurm.bash(str(actors["script"]), *actors["args"], **slurm.job_env(actors, "1002", nodes_a))
        assert actor_job.returncode == 0, actor_job.stderr
    finally:
        release.touch()
        output = learner_job.communicate(timeout=60)[0]
    assert learner_job.returncode == 0, output
    assert not host_file.exists()  # removed when the learner job ends

    srun_l, srun_a = slurm.calls("srun")
    for call, job in ((srun_l, learner), (srun_a, actors)):
        opts = srun_options(call)
        # srun gets cpus-per-task explicitly (Slurm 22.05-23.02.4 does not pass the job's on) and all memory.
        assert opts["--cpus-per-task"] == job["options"]["--cpus-per-task"] and opts["--mem"] == "0"
        assert opts["--nodes"] == "2" and opts["--ntasks-per-node"] == job["options"].get("--ntasks-per-node", "1")

    ranks = slurm.calls("torchrun")
    assert len(ranks) == 2
    for node, call in enumerate(ranks):
        args = torchrun_args(call["argv"])
        assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("2", node, "8")
        assert (args.rdzv_backend, args.master_addr, args.master_port) == ("static", "node-a", 29500)
        assert args.module and args.training_script == "streamrl"
        assert args.training_script_args == ["learner", CONFIG, "actors.tensor_parallel_size=2", "actors.num=8"]
        assert call["env"]["STUB_NODE"] == nodes_l[node]

    started = slurm.calls("streamrl")
    assert len(started) == 8
    for call in started:
        argv = call["argv"]
        index = int(argv[argv.index("--index") + 1])
        # The user's overrides, then actors.num and tp from the allocation (which win).
        assert argv[:-4] == ["actor", CONFIG, "actors.tensor_parallel_size=2", "actors.num=8",
                             "actors.tensor_parallel_size=2"]
        assert argv[-4:] == ["--learner", "node-a", "--index", str(index)]
        # Each actor sees its own GPUs: the ones streamrl.run.placement gives its index.
        assert call["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, actor_gpus(index, 2, 8)))
        assert call["env"]["STUB_NODE"] == nodes_a[index // 4]
    assert sorted(int(c["argv"][c["argv"].index("--index") + 1]) for c in started) == list(range(8))
    assert not slurm.calls("ssh") and not slurm.calls("pdsh")
    assert_no_nccl_error_handling_set(ranks + started)



def test_submit_puts_one_hf_actor_per_gpu_and_refuses_tensor_parallelism_for_hf_before_submitting(slurm):
    """hf does not shard: its actors take one GPU each (tp 1 from ActorConfig.engine_gpus, not an engine's key), and
    an hf run asking for tensor_parallel_size fails in submit.sh, not on the actor nodes after the queue."""
    (slurm.work / "keys").mkdir()
    for i in range(8):
        (slurm.work / "keys" / f"actor-{i}.key_secret").touch()
    refused = slurm.bash(str(CLUSTER / "submit.sh"), CONFIG, "actors.backend=hf", "actors.tensor_parallel_size=2")
    assert refused.returncode != 0 and not slurm.calls("sbatch")
    assert "actors.tensor_parallel_size=2: an option of generation backend 'sglang', generation backend 'vllm'" in \
        refused.stderr and "Allowed: its default (1)" in refused.stderr
    done = slurm.bash(str(CLUSTER / "submit.sh"), CONFIG, "actors.backend=hf")
    assert done.returncode == 0, done.stderr
    _, actors = (sbatch_options(c) for c in slurm.calls("sbatch"))
    assert actors["options"]["--ntasks-per-node"] == "8" and "8 actors" in done.stdout

def actors_job(slurm: Slurm, **env: str) -> subprocess.CompletedProcess:
    job = {"SLURM_JOB_ID": "1002", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "node-c", "STUB_NODES": "node-c",
           "SLURM_NTASKS_PER_NODE": "1", "SLURM_CPUS_PER_TASK": "32", "SLURM_GPUS_ON_NODE": "8",
           "LEARNER_POLL_S": "0.05", **env}
    return slurm.bash(str(CLUSTER / "actors.sbatch"), CONFIG, **job)


def test_actors_wait_for_the_host_their_learner_job_publishes_not_an_older_one(slurm):
    logs = slurm.work / "logs"
    logs.mkdir()
    (logs / "learner-host").write_text("stale-node\n")       # the old scripts' file
    (logs / "learner-host.999").write_text("stale-node\n")   # an earlier learner job's
    # The learner job is queued for 3 polls, then starts and publishes its host.
    done = actors_job(slurm, LEARNER_JOB="1001", STUB_START_AFTER="3",
                      STUB_PUBLISH=f"{logs / 'learner-host.1001'}=fresh-node")
    assert done.returncode == 0, done.stderr
    polls = [c for c in slurm.calls("scontrol") if c["argv"][:3] == ["show", "job", "1001"]]
    assert len(polls) >= 3
    (actor,) = slurm.calls("streamrl")
    assert actor["argv"][actor["argv"].index("--learner") + 1] == "fresh-node"
    assert actor["env"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"  # 1 actor per node: tp 8
    assert actor["argv"][:-4] == ["actor", CONFIG, "actors.num=1", "actors.tensor_parallel_size=8"]


@pytest.mark.parametrize("state, says, host_file", [
    ("CANCELLED", "is CANCELLED", False), ("UNKNOWN", "unknown to scontrol", False), ("PENDING", "no ", False),
    ("COMPLETED", "is COMPLETED", True)])  # a host file an ended learner left behind is not used
def test_actors_give_up_when_their_learner_job_ends_or_never_starts(slurm, state, says, host_file):
    slurm.state.write_text(state)
    if host_file:
        (slurm.work / "logs").mkdir()
        (slurm.work / "logs" / "learner-host.1001").write_text("gone-node\n")
    done = actors_job(slurm, LEARNER_JOB="1001", LEARNER_WAIT_S="0")
    assert done.returncode == 1 and says in done.stderr and "learner-host.1001" in done.stderr
    assert not slurm.calls("srun")


def test_actors_without_a_learner_say_how_to_name_one(slurm):
    done = actors_job(slurm)
    assert done.returncode == 2 and "LEARNER_JOB" in done.stderr
    assert actors_job(slurm, LEARNER="node-x", SLURM_NTASKS_PER_NODE="3").returncode == 2  # 8 GPUs / 3


def test_multinode_deepspeed_starts_one_launcher_per_node_without_ssh(slurm, monkeypatch):
    script = str(CLUSTER / "multinode-deepspeed.sh")
    outside = slurm.bash(script, CONFIG)
    assert outside.returncode == 2 and "inside a Slurm allocation" in outside.stderr
    alloc = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node-a,node-b", "STUB_NODES": "node-a node-b",
             "SLURM_JOB_NUM_NODES": "2", "SLURM_CPUS_PER_TASK": "32", "SLURM_GPUS_ON_NODE": "8"}
    done = slurm.bash(script, CONFIG, "learner.zero_stage=3", **alloc)
    assert done.returncode == 0, done.stderr
    (srun,) = slurm.calls("srun")
    opts = srun_options(srun)
    assert (opts["--nodes"], opts["--ntasks-per-node"], opts["--cpus-per-task"], opts["--mem"]) == ("2", "1", "32", "0")
    launchers = slurm.calls("deepspeed")
    assert [c["env"]["STUB_NODE"] for c in launchers] == ["node-a", "node-b"]
    assert (slurm.work / "logs" / "hostfile.77").read_text() == "node-a slots=8\nnode-b slots=8\n"
    assert not slurm.calls("ssh") and not slurm.calls("pdsh")
    assert_no_nccl_error_handling_set(launchers)

    # What the real DeepSpeed launcher does with each node's argv: no ssh, its node's local launch.
    from deepspeed.launcher import runner

    started: list[list[str]] = []

    class Started:
        returncode = 0

        def wait(self):
            return 0

    def no_ssh(*args, **kwargs):
        raise AssertionError(f"the launcher ran {args[0]}")

    monkeypatch.chdir(slurm.work)
    monkeypatch.setattr(runner.subprocess, "check_call", no_ssh)
    monkeypatch.setattr(runner.subprocess, "check_output", no_ssh)
    monkeypatch.setattr(runner.subprocess, "Popen", lambda cmd, env=None: started.append(cmd) or Started())
    for call in launchers:
        runner.main(call["argv"])
    for node, cmd in enumerate(started):
        assert cmd[cmd.index("-m") + 1] == "deepspeed.launcher.launch"
        assert f"--node_rank={node}" in cmd and "--master_addr=node-a" in cmd and "--master_port=29500" in cmd
        assert cmd[cmd.index("streamrl"):] == ["streamrl", "learner", CONFIG, "learner.zero_stage=3"]
        assert "--module" in cmd and "--no_local_rank" in cmd
        world = json.loads(base64.urlsafe_b64decode(next(a for a in cmd if a.startswith("--world_info="))[13:]))
        assert world == {"node-a": list(range(8)), "node-b": list(range(8))}



def test_actors_for_a_learner_job_submit_only_an_actor_job_that_rejoins_it(slurm):
    (slurm.work / "keys").mkdir()
    for i in range(8):
        (slurm.work / "keys" / f"actor-{i}.key_secret").touch()
    submit = (str(CLUSTER / "submit.sh"), "--actor-nodes", "2", "--actors-for", "77", CONFIG,
              "actors.tensor_parallel_size=2")
    for state, says in (("COMPLETED", "is COMPLETED"), ("UNKNOWN", "is unknown to scontrol")):
        slurm.state.write_text(state)
        ended = slurm.bash(*submit)
        assert ended.returncode == 2 and f"--actors-for 77: that learner job {says}" in ended.stderr, ended.stderr
    assert slurm.bash(*submit[:4], "latest", *submit[5:]).returncode == 2  # not a job id
    assert not slurm.calls("sbatch")

    slurm.state.write_text("RUNNING")
    done = slurm.bash(*submit)
    assert done.returncode == 0, done.stderr
    assert "actors job 1001 (8 actors" in done.stdout and "rejoins learner job 77" in done.stdout
    (actors,) = (sbatch_options(c) for c in slurm.calls("sbatch"))  # no second learner
    assert actors["script"].name == "actors.sbatch" and actors["args"] == list(submit[5:])
    assert actors["options"]["--dependency"] == "after:77" and "LEARNER_JOB=77" in actors["options"]["--export"]
    assert (actors["options"]["--nodes"], actors["options"]["--ntasks-per-node"]) == ("2", "4")
