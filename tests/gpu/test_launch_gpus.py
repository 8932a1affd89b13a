"""`streamrl run`'s GPU placement on real CUDA: the GPUs it finds are the machine's, and a child
started with the CUDA_VISIBLE_DEVICES it is given sees exactly those. Skips without CUDA."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from streamrl import config
from streamrl.commands.launch import gpu_plan, visible_gpus

pytestmark = pytest.mark.gpu

_PROBE = "import torch; print(torch.cuda.device_count(), torch.cuda.get_device_properties(0).uuid)"


def _child(env_extra: dict) -> tuple[int, str]:
    out = subprocess.run([sys.executable, "-c", _PROBE], env={**os.environ, **env_extra},
                         capture_output=True, text=True, check=True, timeout=120).stdout.split()
    return int(out[0]), out[1]


def test_each_process_sees_exactly_the_gpus_streamrl_run_gives_it():
    import torch

    gpus = visible_gpus()
    assert len(gpus) == torch.cuda.device_count() >= 1
    cfg = config.load(None, ["actors.num=2"])
    learner, actors = gpu_plan(cfg, gpus)
    envs = {"learner": learner, **{f"actor-{i}": a for i, a in enumerate(actors)}}
    seen = {name: _child(env) for name, env in envs.items()}
    assert all(count == 1 for count, _ in seen.values())  # one GPU each (hf actors, one learner rank)
    if len(gpus) >= 3:  # learner and both actors on distinct devices
        assert len({uuid for _, uuid in seen.values()}) == 3
