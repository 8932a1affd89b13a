"""A package a user installs brings a plug-in of every kind (task, environment, objective, advantage estimator,
generation backend, tracker), each with its own options, through entry points alone: a real .dist-info folder on
sys.path (what pip writes), nothing registered by hand. The config parses each plug-in's keys by its Struct, under
the same section as streamrl's own, and what a plug-in declares it can do decides what the config allows."""

from __future__ import annotations

import sys

import pytest

from streamrl import config, registry
from streamrl.config import ConfigError

PACKAGE = '''
from msgspec import Meta
from typing import Annotated
from streamrl.actors.backends import specs
from streamrl.registry import Options, Plugin
from streamrl.tasks.base import TaskDefaults


class StepsOptions(Options):
    my_steps: Annotated[int, Meta(ge=1)] = 2
    """Levels of the task's reward."""


class MyTask(TaskDefaults):
    Options = StepsOptions  # a bare class may carry its options itself

    @classmethod
    def levels(cls, task):
        return [i / task.my_steps for i in range(task.my_steps + 1)]


class DepthOptions(Options):
    env_depth: int = 1
    """Turns the environment plays."""


class MyEnv:
    Options = DepthOptions

    def __init__(self, row, options):
        self.row, self.depth = row, options.env_depth

    def reset(self):
        return [{"role": "user", "content": "hi"}]

    def step(self, reply):
        return [], 1.0, True


class MarginOptions(Options):
    my_margin: Annotated[float, Meta(gt=0)] = 0.1
    """The objective's margin."""


def my_loss(logprobs, behaviour_logprobs, advantages, mask, *, my_margin=0.1, **_):
    raise NotImplementedError


class ShiftOptions(Options):
    my_shift: float = 0.0
    """Added to every advantage."""


def my_estimator(rewards, r_min_correct, std_normalize=False, my_shift=0.0):
    return rewards - r_min_correct + my_shift


class EngineOptions(Options):
    my_engine_flag: str = "fast"
    """How the engine runs."""


class DirOptions(Options):
    my_tracker_dir: str = "logs"
    """Where the tracker writes."""


TASK = Plugin(item=MyTask)
LOSS = Plugin(item=my_loss, options=MarginOptions)
ESTIMATOR = Plugin(item=my_estimator, options=ShiftOptions)
BACKEND = Plugin(load="my_plugins:MyBackend", options=EngineOptions, capabilities={"inflight_updates"})
BARE_BACKEND = Plugin(load="my_plugins:MyBackend")
LACKING_BACKEND = Plugin(load="my_plugins:MyBackend", capabilities={"tensor_parallel"})  # no tensor_parallel_size


class ShardOptions(specs.EngineOptions):  # streamrl's engine options, and its own
    my_shard_flag: bool = False
    """An engine's own switch beside streamrl's engine options."""


SHARDING_BACKEND = Plugin(load="my_plugins:MyBackend", options=ShardOptions, capabilities={"tensor_parallel"})
TRACKER = Plugin(item=object(), options=DirOptions)
'''
ENTRY_POINTS = {"streamrl.tasks": {"my_task": "my_plugins:TASK"},
                "streamrl.environments": {"my_env": "my_plugins:MyEnv"},
                "streamrl.losses": {"my_loss": "my_plugins:LOSS"},
                "streamrl.estimators": {"my_estimator": "my_plugins:ESTIMATOR"},
                "streamrl.backends": {"my_backend": "my_plugins:BACKEND", "bare_backend": "my_plugins:BARE_BACKEND",
                                      "my_lacking_backend": "my_plugins:LACKING_BACKEND",
                                      "my_sharding_backend": "my_plugins:SHARDING_BACKEND"},
                "streamrl.trackers": {"my_tracker": "my_plugins:TRACKER"}}
MINE = ["task.name=my_task", "task.my_steps=4", "task.environment=my_env", "task.env_depth=3",
        "loss.name=my_loss", "loss.my_margin=0.5", "advantage.estimator=my_estimator", "advantage.my_shift=0.25",
        "actors.backend=my_backend", "actors.my_engine_flag=careful", "monitoring.report_to=[my_tracker]",
        "monitoring.my_tracker_dir=/tmp/mine"]


@pytest.fixture
def installed(tmp_path, monkeypatch):
    (tmp_path / "my_plugins.py").write_text(PACKAGE)
    info = tmp_path / "my_plugins-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugins\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) for group, entries in ENTRY_POINTS.items()))
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.entry_points.cache_clear()
    yield
    for reg in registry.KINDS.values():  # what the package's entry points added to streamrl's registries
        for name in [n for n in reg._plugins if n.startswith(("my_", "bare_"))]:
            del reg._plugins[name]
    registry.entry_points.cache_clear()
    sys.modules.pop("my_plugins", None)


def test_an_installed_package_adds_a_plug_in_of_every_kind(installed):
    for kind, name in [("task", "my_task"), ("environment", "my_env"), ("loss", "my_loss"),
                       ("estimator", "my_estimator"), ("backend", "my_backend"), ("tracker", "my_tracker")]:
        assert name in registry.KINDS[kind].names()
        assert registry.KINDS[kind].origin(name).endswith("(entry point, my-plugins 1.0)")


def test_an_installed_environment_is_built_for_each_episode_with_its_own_options(installed):
    from streamrl.tasks import environments

    cfg = config.load(None, MINE)
    cls = environments.load(cfg.task.environment)
    env = cls({"prompt": "hi", "id": "r0"}, *environments.options_of(cls, cfg.task))   # as the episode runner does
    assert env.depth == 3 and env.row["id"] == "r0"
    bare = config.load(None, [k for k in MINE if not k.startswith("task.env_depth")])
    assert cls({}, *environments.options_of(cls, bare.task)).depth == 1   # its default where the config sets none


def test_each_installed_plug_in_brings_its_own_options_under_its_section(installed):
    cfg = config.load(None, MINE)
    assert (cfg.task.my_steps, cfg.task.env_depth) == (4, 3)
    assert type(cfg.task.options_for(registry.TASKS)).__name__ == "StepsOptions"
    assert type(cfg.task.options_for(registry.ENVIRONMENTS)).__name__ == "DepthOptions"
    assert cfg.loss.my_margin == 0.5 and cfg.loss.objective_knobs()["my_margin"] == 0.5
    assert cfg.advantage.my_shift == 0.25
    import torch

    from streamrl.algo import advantages

    shifted = advantages.compute(torch.tensor([[0.0, 1.0]]), "my_estimator", 0.5,
                                 **cfg.advantage.options_dict(registry.ESTIMATORS))
    assert shifted.tolist() == [[-0.25, 0.75]]  # the estimator got its option
    assert cfg.actors.my_engine_flag == "careful"
    assert cfg.monitoring.my_tracker_dir == "/tmp/mine"
    # The task's option reached the task: its levels (4 steps) make 0.75 a level.
    assert cfg.advantage.r_min_correct == 0.75
    assert config.load(None, config.overrides_for(cfg)) == cfg  # written back flat, read back the same


def test_an_installed_plug_ins_option_is_checked_by_its_struct(installed):
    with pytest.raises(ConfigError, match=r"loss.my_margin=0: loss 'my_loss'.*allowed: float > 0"):
        config.load(None, [*MINE, "loss.my_margin=0"])
    with pytest.raises(ConfigError, match=r"task.my_step=4: unknown key under 'task' \(did you mean 'task.my_steps'"):
        config.load(None, ["task.name=my_task", "task.my_step=4"])
    with pytest.raises(ConfigError, match=r"actors.my_engine_flag=\[1\]: generation backend 'my_backend'"):
        config.load(None, [*MINE, "actors.my_engine_flag=[1]"])


def test_what_an_installed_backend_declares_decides_what_the_config_allows(installed):
    assert config.load(None, ["actors.backend=my_backend", "actors.inflight_updates=true"]).actors.inflight_updates
    with pytest.raises(ConfigError, match="the bare_backend backend loads weights between generate calls only"):
        config.load(None, ["actors.backend=bare_backend", "actors.inflight_updates=true"])


def test_tensor_parallelism_is_refused_for_an_installed_backend_without_the_capability(installed):
    with pytest.raises(ConfigError, match=r"actors.tensor_parallel_size=2: an option of .*which this run does not "
                                          r"name \(actors names generation backend 'bare_backend'\)"):
        config.load(None, ["actors.backend=bare_backend", "actors.tensor_parallel_size=2"])
    assert config.load(None, ["actors.backend=bare_backend"]).actors.engine_gpus() == 1


def test_an_installed_backend_with_the_capability_brings_the_option_the_launcher_reads(installed):
    from streamrl.commands.launch import gpu_plan

    cfg = config.load(None, ["actors.backend=my_sharding_backend", "actors.tensor_parallel_size=2",
                             "actors.my_shard_flag=true", "actors.num=2"])
    assert type(cfg.actors.options_for(registry.BACKENDS)).__name__ == "ShardOptions" and cfg.actors.my_shard_flag
    assert cfg.actors.engine_gpus() == 2
    assert gpu_plan(cfg, ["0", "1", "2", "3", "4"])[1] == [{"CUDA_VISIBLE_DEVICES": "1,2"},
                                                          {"CUDA_VISIBLE_DEVICES": "3,4"}]


def test_a_backend_declaring_a_capability_without_the_option_it_needs_is_refused_naming_both(installed):
    with pytest.raises(ConfigError, match=r"actors.backend='my_lacking_backend': declares tensor_parallel "
                                          r"\(tensor_parallel_size\), but its options \(none, my_plugins:MyBackend"):
        config.load(None, ["actors.backend=my_lacking_backend"])
