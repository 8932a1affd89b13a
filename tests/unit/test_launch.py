"""`streamrl run`: ports no outgoing connection can take while the learner starts, and each process on its own GPUs."""

from __future__ import annotations

import socket

from streamrl.commands.launch import free_ports


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    ports = free_ports(8)
    assert len(set(ports)) == 8 and all(20000 <= p < low for p in ports)
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


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
    monkeypatch.setattr(launch, "visible_gpus", lambda: ["0", "1", "2"])
    monkeypatch.setattr(launch, "spawn", lambda args, log, ranks=1, env_extra=None: started.append(
        (args[0], env_extra)) or Exited())
    cfg = _cfg(**{"run_dir": str(tmp_path), "actors.num": 2})
    assert launch.run(cfg, out=open(tmp_path / "out.txt", "w")) == 0
    assert started == [("learner", {"CUDA_VISIBLE_DEVICES": "0"}), ("actor", {"CUDA_VISIBLE_DEVICES": "1"}),
                       ("actor", {"CUDA_VISIBLE_DEVICES": "2"})]
    assert "actor-1 2" in (tmp_path / "out.txt").read_text()
