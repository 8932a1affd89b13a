"""The declared extension points (issue 35): every built-in task, environment, reward function and backend
satisfies its Protocol, and a plug-in that leaves out an optional member gets the documented default."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import pytest

from streamrl.actors.backends import BACKENDS
from streamrl.actors.backends.base import Backend, BackendDefaults
from streamrl.tasks import TASKS, Prompt, distinct, plugins
from streamrl.tasks.base import Task, TaskDefaults, optional
from streamrl.tasks.environments import Environment, EnvironmentDefaults
from streamrl.tasks.reward_functions import RewardFunction
from streamrl.tasks.rewards import Reward

REPO = Path(__file__).resolve().parents[3]


def members(protocol: type) -> list[str]:
    """The names a Protocol declares (typing has no public accessor before 3.13)."""
    names = [n for n in vars(protocol) if not n.startswith("_")]
    return names + (["__call__"] if "__call__" in vars(protocol) else [])


def missing(cls: type, protocol: type) -> list[str]:
    return [n for n in members(protocol) if not hasattr(cls, n)]


def test_the_member_lists_are_what_the_docs_promise():
    assert sorted(members(Task)) == sorted(["from_config", "levels", "reward_levels", "sample", "eval_set", "score",
                                            "vocabulary"])
    assert sorted(members(Environment)) == ["reset", "step"]
    assert sorted(members(Backend)) == sorted(["generate", "load_weights", "eval_sampler", "end_ids",
                                               "engine_stats", "close"])


BUILT_IN_TASKS = sorted(n for n, ep in plugins.entry_points().items() if ep.value.startswith("streamrl.tasks."))


def test_streamrl_declares_its_tasks():
    assert {"copy", "code_verifier", "math", "dataset", "lookup"} <= set(BUILT_IN_TASKS)


@pytest.mark.parametrize("name", BUILT_IN_TASKS)
def test_every_built_in_task_class_has_the_task_members_and_the_defaults(name):
    cls = TASKS.get(name)
    assert missing(cls, Task) == []
    assert issubclass(cls, TaskDefaults)  # so its optional members are there, the defaults where it has none


@pytest.mark.parametrize("name", ["copy", "reverse", "repeat_first", "lookup"])
def test_a_built_task_is_a_task(name):
    from streamrl.config import TaskConfig

    assert isinstance(TASKS.get(name).from_config(TaskConfig(name=name)), Task)


def test_every_built_in_environment_is_an_environment():
    from streamrl.tasks import lookup

    for cls in (lookup.LookupEnv, lookup.LookupNoToolEnv):
        env = cls({"key": "k", "symbol": "a", "prompt": "k", "id": "0"})
        assert isinstance(env, Environment) and isinstance(env, EnvironmentDefaults)
    assert lookup.LookupEnv({"key": "k", "symbol": "a"}).tools and lookup.LookupNoToolEnv({"key": "k",
                                                                                           "symbol": "a"}).tools == []


@pytest.mark.parametrize("name", sorted(BACKENDS.names()))
def test_every_backend_has_the_backend_members(name):
    """vllm and sglang need their engines to be built: their classes are checked, hf is built too."""
    cls = BACKENDS.get(name)
    assert missing(cls, Backend) == []
    assert issubclass(cls, BackendDefaults)
    assert "between_steps" in inspect.signature(cls.generate).parameters


def test_the_hf_backend_is_a_backend():
    from streamrl import config
    from streamrl.actors import backends
    from streamrl.models import model as model_lib

    cfg = config.load(None, ["actors.device=cpu"])
    model, tok = model_lib.build(cfg, TASKS.get("copy").from_config(cfg.task).vocabulary)
    backend = backends.build("hf", cfg, model, tok)
    assert isinstance(backend, Backend)
    assert backend.end_ids and backend.engine_stats() is None
    backend.close()


def _reward_functions() -> list:
    from streamrl.tasks import graders

    spec = importlib.util.spec_from_file_location("chat_reward", REPO / "examples" / "chat-dataset" / "reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [graders.rubric, module.first_word]


@pytest.mark.parametrize("fn", _reward_functions(), ids=lambda f: f.__name__)
def test_the_shipped_reward_functions_are_reward_functions(fn):
    assert isinstance(fn, RewardFunction)
    params = inspect.signature(fn).parameters
    assert {"prompts", "completions"} <= set(params)
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())  # columns it does not use


class Bare:
    """A plug-in task with the seven required members only."""

    @classmethod
    def from_config(cls, cfg):
        return cls()

    @staticmethod
    def levels(cfg):
        return [0.0, 1.0]

    reward_levels = [0.0, 1.0]
    vocabulary = ["a", "b"]

    def sample(self, rng):
        return Prompt(id=rng.choice("ab"), text="x")

    def eval_set(self, size, seed=12345):
        return distinct(self.sample, size or 2, seed)

    def score(self, prompt, completion):
        return float(completion == prompt.id)


def test_a_plug_in_without_the_optional_members_gets_the_defaults():
    task = Bare()
    assert isinstance(task, Task) and not isinstance(task, TaskDefaults)
    assert optional(Bare, "reward_map")(None)(0.25) == 0.25 and optional(Bare, "levels_take_edges") is False
    assert optional(task, "levels_for")([0.5]) == [0.0, 1.0] and optional(task, "category") is None
    reward = Reward(task)
    assert reward.levels == [0.0, 1.0] and reward.unparseable == 0 and reward.grouped is False
    assert reward(Prompt(id="a", text="x"), "a") == 1.0
    reward.close()
    with pytest.raises(AttributeError, match="not an optional task member"):
        optional(task, "score")


def test_a_plug_ins_own_optional_members_win():
    class Counting(Bare):
        grouped = False
        unparseable = 0

        def levels_for(self, edges):
            return [0.0, 0.5, 1.0]

        def score(self, prompt, completion):
            self.unparseable += 1
            return 0.0

    reward = Reward(Counting())
    assert reward.levels == [0.0, 0.5, 1.0]
    reward(Prompt(id="a", text="x"), "b")
    assert reward.unparseable == 1


def test_a_dataset_tasks_close_lets_its_reward_threads_go(tmp_path):
    from streamrl.config import TaskConfig

    (tmp_path / "rows.jsonl").write_text('{"prompt": "a", "answer": "a"}\n')
    cfg = TaskConfig(name="dataset", data=str(tmp_path / "rows.jsonl"),
                     reward=str(REPO / "examples" / "chat-dataset" / "reward.py") + ":first_word", reward_levels=[0, 1])
    task = TASKS.get("dataset").from_config(cfg)
    Reward(task).close()
    assert task.functions.pool._shutdown
