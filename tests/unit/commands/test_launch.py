"""`streamrl run`: ports no outgoing connection can take while the learner starts, each process on its own
GPUs, and an exit status that tells a finished run from every other ending."""

from __future__ import annotations

import json
import signal
import socket

import pytest

from streamrl.commands import supervisor
from streamrl.commands.launch import free_ports


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    ports = free_ports(8)
    assert len(set(ports)) == 8 and all(20000 <= p < low for p in ports)
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_exit_statuses_tell_a_finished_run_from_every_other_ending(tmp_path):
    from streamrl.commands.launch import EXIT_STATUSES
    from streamrl.commands.supervisor import outcome

    log = tmp_path / "learner.log"
    log.write_text("12:00:00 learner ERROR failed\nTraceback ...\nstreamrl learner: error: TimeoutError: no group\n")
    done, stopped = {"status": "finished"}, {"status": "stopped"}
    assert outcome(0, done, None, None, log) == (0, None)
    assert outcome(0, stopped, signal.SIGINT, None, log) == (130, None)
    assert outcome(0, stopped, signal.SIGTERM, None, log) == (143, None)
    assert outcome(-signal.SIGKILL, None, signal.SIGINT, None, log) == (130, None)  # a second Ctrl-C killed it
    assert outcome(0, stopped, None, "every actor failed", log)[0] == 3
    assert outcome(0, stopped, None, None, log)[0] == 4
    code, line = outcome(1, None, None, None, log)
    assert code == 1 and line == f"learner failed: TimeoutError: no group (traceback in {log})"
    code, line = outcome(-signal.SIGKILL, None, None, None, log)
    assert code == 1 and line == f"learner was killed by SIGKILL (its log: {log})"
    code, line = outcome(1, {"status": "failed", "error": "disk full (...) writing x"}, None, None, log)
    assert code == 1 and line.startswith("learner failed: disk full")
    documented = {code for code, _ in EXIT_STATUSES}
    assert {0, 1, 2, 3, 4, 130, 143} == documented


def test_the_exit_statuses_are_in_run_help(capsys):
    from streamrl.commands import cli

    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    out = capsys.readouterr().out
    assert "exit status:" in out and "130" in out and "143" in out and "every actor failed" in out


def test_a_resumed_runs_earlier_steps_are_not_shown_as_new_progress(tmp_path, monkeypatch):
    """The tail skips the lines metrics.jsonl held before the resumed learner started."""
    metrics = tmp_path / "metrics.jsonl"
    old = [json.dumps({"step": i, "t": 1.0}) for i in range(6)]
    metrics.write_text("".join(x + "\n" for x in old))
    seen = supervisor._line_hashes(metrics)
    metrics.write_text("".join(x + "\n" for x in old[:3]))  # the learner keeps steps < 3 (its checkpoint) ...
    with open(metrics, "a") as f:                          # ... and redoes 3, 4, 5
        f.write("".join(json.dumps({"step": i, "t": 2.0}) + "\n" for i in range(3, 6)))
    new = [json.loads(x)["step"] for x in supervisor._Tail(metrics).lines() if hash(x) not in seen]
    assert new == [3, 4, 5]


def _cfg(**overrides):
    from streamrl import config

    return config.load(None, [f"{k}={v}" for k, v in overrides.items()])


def test_streamrl_run_gives_each_actor_its_own_gpus_after_the_learners():
    from streamrl.commands.launch import gpu_plan

    cfg = _cfg(**{"learner.ranks": 2, "actors.num": 3, "actors.backend": "vllm", "actors.tensor_parallel_size": 2})
    learner, actors = gpu_plan(cfg, [str(i) for i in range(8)])
    assert learner == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert [a["CUDA_VISIBLE_DEVICES"] for a in actors] == ["2,3", "4,5", "6,7"]


def test_gpu_plan_maps_through_the_launchers_own_visible_devices_and_shares_when_short():
    from streamrl.commands.launch import gpu_plan

    # The supervisor sees GPUs 4-7 only: children get those physical ids; 3 actors on 3 free GPUs.
    learner, actors = gpu_plan(_cfg(**{"actors.num": 4}), ["4", "5", "6", "7"])
    assert learner["CUDA_VISIBLE_DEVICES"] == "4"
    assert [a["CUDA_VISIBLE_DEVICES"] for a in actors] == ["5", "6", "7", "5"]
    # One GPU: learner and both actors on it (what the gpu-marked loop test runs).
    learner, actors = gpu_plan(_cfg(), ["0"])
    assert learner == {"CUDA_VISIBLE_DEVICES": "0"} and all(a == {"CUDA_VISIBLE_DEVICES": "0"} for a in actors)


def test_gpu_plan_sets_nothing_without_gpus_or_for_cpu_actors_and_refuses_too_few_gpus():
    import pytest

    from streamrl.config import ConfigError
    from streamrl.commands.launch import gpu_plan

    assert gpu_plan(_cfg(), []) == ({}, [{}, {}])
    assert gpu_plan(_cfg(**{"actors.device": "cpu"}), ["0", "1"])[1] == [{}, {}]
    with pytest.raises(ConfigError, match="tensor_parallel_size=4: each actor needs 4 GPUs, this machine has 2"):
        gpu_plan(_cfg(**{"actors.backend": "sglang", "actors.tensor_parallel_size": 4}), ["0", "1"])


def test_streamrl_run_starts_each_process_with_its_gpus(monkeypatch, tmp_path):
    from streamrl.commands import launch

    class Exited:  # a child that has already finished
        returncode = 0

        def poll(self):
            return 0

        def wait(self, timeout=None):
            return 0

    started = []
    cfg = _cfg(**{"run_dir": str(tmp_path), "actors.num": 2})

    def spawn(args, log, ranks=1, env_extra=None, fork=False):
        started.append((args[0], env_extra))
        if args[0] == "learner":  # exit 0 means a finished run: the learner's summary says so
            (cfg.run_path / "summary.json").write_text(json.dumps(
                {"status": "finished", "wall_s": 1.0, "steps": 1, "reward_first_10pct": 0.0, "reward_last_10pct": 0.0,
                 "groups_used": 16, "groups_dropped": {}, "messages_rejected": {}}))
        return Exited()

    monkeypatch.setattr(launch, "visible_gpus", lambda: ["0", "1", "2"])
    monkeypatch.setattr(launch, "spawn", spawn)
    assert launch.run(cfg, out=open(tmp_path / "out.txt", "w")) == 0
    assert started == [("learner", {"CUDA_VISIBLE_DEVICES": "0"}), ("actor", {"CUDA_VISIBLE_DEVICES": "1"}),
                       ("actor", {"CUDA_VISIBLE_DEVICES": "2"})]
    assert "actor-1 2" in (tmp_path / "out.txt").read_text()


def test_two_learner_ranks_on_a_one_gpu_machine_are_refused_instead_of_asking_for_cuda_1():
    import pytest

    from streamrl.commands.launch import gpu_plan
    from streamrl.config import ConfigError

    with pytest.raises(ConfigError, match=r"learner.ranks=2: each learner rank needs a GPU of its own, this machine "
                                          r"has 1 \(allowed: 1..1\)"):
        gpu_plan(_cfg(**{"learner.ranks": 2}), ["0"])
    assert gpu_plan(_cfg(**{"learner.ranks": 2}), [])[0] == {}  # CPU ranks (gloo) need no GPU


def test_vllm_engines_sharing_a_gpu_need_their_memory_share_set_and_within_the_gpu():
    import pytest

    from streamrl.commands.launch import gpu_plan
    from streamrl.config import ConfigError

    two_on_one = {"actors.backend": "vllm", "actors.num": 2}  # 2 GPUs: learner on 0, both engines on 1
    with pytest.raises(ConfigError, match="GPU 1 runs 2 vllm engine.s.: set actors.gpu_memory_fraction .* at most 0.45"):
        gpu_plan(_cfg(**two_on_one), ["0", "1"])
    with pytest.raises(ConfigError, match="gpu_memory_fraction=0.5: GPU 1 runs 2 vllm engine.s., so each may take at "
                                          "most 0.45"):
        gpu_plan(_cfg(**two_on_one, **{"actors.gpu_memory_fraction": 0.5}), ["0", "1"])
    _, actors = gpu_plan(_cfg(**two_on_one, **{"actors.gpu_memory_fraction": 0.45}), ["0", "1"])
    assert [a["CUDA_VISIBLE_DEVICES"] for a in actors] == ["1", "1"]
    # one GPU: the engines beside the learner share half of it
    with pytest.raises(ConfigError, match="GPU 0 runs 2 sglang engine.s. and the learner: .* at most 0.25"):
        gpu_plan(_cfg(**{"actors.backend": "sglang", "actors.num": 2}), ["0"])
    gpu_plan(_cfg(**{"actors.backend": "sglang", "actors.num": 2, "actors.gpu_memory_fraction": 0.25}), ["0"])
    # an engine alone on its GPU keeps the engine's default
    assert gpu_plan(_cfg(**{"actors.backend": "vllm"}), ["0", "1", "2"])[1] == [{"CUDA_VISIBLE_DEVICES": "1"},
                                                                             {"CUDA_VISIBLE_DEVICES": "2"}]


def test_the_progress_line_shows_reward_failures_whenever_there_are_any():
    from streamrl.commands.supervisor import progress_line

    rec = {"step": 9, "reward_mean": 0.5, "r_count": 0.0, "failed_positive_fraction": 0.0, "lag_mean": 1.0,
           "lag_max": 1, "samples_per_s": 100.0, "groups_dropped": {}, "elapsed_s": 3.0, "reward_failures": {}}
    assert "reward failures" not in progress_line(rec, 100, 2)
    line = progress_line({**rec, "reward_failures": {"raised": 3, "calls_failed": 4}}, 100, 2)
    assert line.endswith("reward failures {'raised': 3, 'calls_failed': 4}"), line


def test_a_learner_failing_before_its_own_summary_is_told_by_its_cause_not_by_the_previous_lifes_summary(tmp_path):
    import io

    cfg = _cfg(**{"run_dir": str(tmp_path), "learner.resume": "true"})
    (cfg.run_path / "logs").mkdir(parents=True)
    (cfg.run_path / "summary.json").write_text(json.dumps({"status": "failed", "error": "learner was killed by SIGKILL"}))
    out = io.StringIO()
    sup = supervisor.Supervisor(cfg, cfg.run_path / "config.yaml", {}, [], spawn=None, out=out)

    class Failed:  # refused its resume at start, before it wrote a summary of its own
        returncode = 1

    sup.learner = Failed()
    (cfg.run_path / "logs" / "learner.log").write_text(
        "streamrl learner: error: ValueError: learner.resume=true (checkpoint step-2): the checkpoint's data cursor "
        "was made with seed=0, this run has seed=1\n")
    assert sup.report() == 1
    said = out.getvalue()
    assert "learner failed: ValueError: learner.resume=true" in said and "seed=1" in said, said
    assert "SIGKILL" not in said, said
