"""task.name: verifiers on verifiers 0.4's v1 stack (streamrl.tasks.verifiers_v1): a v1 taskset loaded by package
folder or id, its tasks as the rows, each episode verifiers' own `env.run_episode` through its interception server
to the actor's endpoint, the trace's weighted reward snapped to the declared levels. Runs where verifiers 0.4 is
installed (.ci/run's .venv-vf04); skipped beside verifiers 0.3.x, the classic API."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from streamrl.config import TaskConfig
from streamrl.tasks.verifiers_env import VerifiersTask

verifiers = pytest.importorskip("verifiers")
if hasattr(verifiers, "Environment"):
    pytest.skip(f"verifiers {verifiers.__version__} is the classic API (test_verifiers_env.py); the v1 adapter "
                "needs verifiers 0.4 (pip install -e '.[verifiers-v1]')", allow_module_level=True)

from streamrl.tasks import verifiers_v1  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "verifiers-v1-copy"
PACKAGE = EXAMPLE / "copy_v1"
SMALL = {"symbols": "ab", "length": 2}


def _task(**more) -> VerifiersTask:
    return VerifiersTask(TaskConfig(name="verifiers", opts={"verifiers_env": str(PACKAGE), "verifiers_args": SMALL},
                                    reward_levels=[0.0, 0.5, 1.0], **more))


def test_the_tasksets_tasks_are_the_rows_with_their_answers():
    task = _task()
    assert len(task.train) == 4 and task.eval_rows is None  # every ab string of length 2
    row = task.train[0]
    assert row.prompt == "copy : a a =" and row.columns == {"answer": "a a", "task_index": 0}
    assert [r.columns["task_index"] for r in task.train] == [0, 1, 2, 3]
    assert set(task.vocabulary) == {"copy", ":", "a", "b", "="}
    assert task.agent_fn.kind == "verifiers environment" and task.agent_fn.__name__ == "verifiers:copy_v1"
    assert type(task.env).__name__ == "SingleAgentEnv"
    assert type(task.env._harnesses["agent"]).__name__ == "CopyHarness"  # the taskset's own harness, not bash


def test_a_taskset_is_named_by_its_folder_or_installed_id_and_bad_names_are_refused(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    assert len(list(verifiers_v1.load("copy-v1", {"length": 1}).taskset)) == 4  # an id: its package, abcd
    with pytest.raises(ValueError, match="no installed v1 taskset 'no-such-taskset' \\(no module 'no_such_taskset'\\)"):
        verifiers_v1.load("no-such-taskset", {})
    with pytest.raises(ValueError, match=r"classic environment \('file.py'.*verifiers>=0.3,<0.4"):
        verifiers_v1.load("copy_env.py", {})
    with pytest.raises(ValueError, match="task.verifiers_args do not fit the taskset's config"):
        verifiers_v1.load(str(PACKAGE), {"lenght": 2})


CONTAINER = '''
import verifiers.v1 as vf


class Data(vf.TaskData):
    pass


class BoxTask(vf.Task[Data]):
    NEEDS_CONTAINER = {needs}


class BoxTaskset(vf.Taskset[BoxTask, vf.TasksetConfig]):
    INFINITE = {infinite}

    def load(self):
        return [BoxTask(Data(prompt="copy : a ="), self.config.task)]


__all__ = ["BoxTaskset"]
'''


@pytest.mark.parametrize("needs, infinite, refused", [(True, False, "its tasks need a container"),
                                                      (False, True, "an infinite taskset")])
def test_what_streamrl_cannot_run_is_refused_at_load_naming_what_is_allowed(tmp_path, needs, infinite, refused):
    package = tmp_path / f"box_{needs}_{infinite}".lower()
    package.mkdir()
    (package / "__init__.py").write_text(CONTAINER.format(needs=needs, infinite=infinite))
    with pytest.raises(ValueError, match=refused):
        verifiers_v1.load(str(package), {})


PLUGINS = {
    "duo_v1": """
import verifiers.v1 as vf
from copy_v1 import CopyHarness, CopyTaskset


class DuoConfig(vf.EnvConfig):
    solver: vf.AgentConfig = vf.AgentConfig()
    checker: vf.AgentConfig = vf.AgentConfig()


class DuoEnv(vf.Env[DuoConfig]):
    async def run(self, task, agents):
        await agents.solver.run(task)


__all__ = ["CopyTaskset", "CopyHarness", "DuoEnv"]
""",
    "docked_v1": """
import verifiers.v1 as vf
from copy_v1 import CopyHarness, CopyTaskset


class DockedConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.DockerConfig())


class DockedEnv(vf.Env[DockedConfig]):
    async def run(self, task, agents):
        await agents.agent.run(task)


__all__ = ["CopyTaskset", "CopyHarness", "DockedEnv"]
""",
    "boxed_v1": """
from copy_v1 import CopyHarness, CopyTaskset


class BoxedHarness(CopyHarness):
    NEEDS_CONTAINER = True


__all__ = ["CopyTaskset", "BoxedHarness"]
""",
}


@pytest.mark.parametrize("name, refused", [("duo_v1", "declares 2 agents \\(solver, checker\\).*single-agent"),
                                           ("docked_v1", "pins the 'docker' runtime.*allowed: harnesses that run on "
                                                         "the local"),
                                           ("boxed_v1", "harness 'boxed_v1' needs a container runtime")])
def test_multi_agent_envs_and_container_runtimes_or_harnesses_are_refused(tmp_path, monkeypatch, name, refused):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text(PLUGINS[name])
    with pytest.raises(ValueError, match=refused):
        verifiers_v1.load(str(tmp_path / name), {})


def _run(task_cfg_overrides: list[str], tmp_path, prompts: int = 4):
    """Episodes of the example's taskset on the tiny hf model, through the actor's endpoint."""
    from streamrl import config
    from streamrl.actors import backends
    from streamrl.actors.agents import AgentEpisodes
    from streamrl.models import model as model_lib
    from streamrl.tasks import rewards

    cfg = config.load(str(EXAMPLE / "config.yaml"), [
        f"task.verifiers_env={PACKAGE}", "task.verifiers_args={symbols: ab, length: 2}", "task.reward_levels=[0,0.5,1]",
        "advantage.r_min_correct=1", f"run_dir={tmp_path}", *task_cfg_overrides])
    reward = rewards.build(cfg)
    model, tok = model_lib.build(cfg, reward.task.vocabulary)
    backend = backends.build("hf", cfg, model, tok)
    runner = AgentEpisodes(cfg, 0, backend, tok, reward, "actor-0", backend.eos_ids)
    rng = random.Random(0)
    try:
        prompts_ = [reward.task.sample(rng) for _ in range(prompts)]
        groups, stats, done = runner.make_groups(prompts_, version=0)
        return prompts_, groups, stats, done, runner.turns_log, tok
    finally:
        runner.close()
        reward.close()


def test_each_episode_is_one_turn_through_the_endpoint_scored_by_the_tasks_reward(tmp_path):
    """The trace's reward is the task's `@vf.reward` of the very tokens the endpoint sampled: recomputed here from
    each episode's recorded turn (its completion ids decoded), group by group."""
    prompts, groups, stats, done, turns, tok = _run([], tmp_path)
    assert len(groups) == 4 and done.reward_raised == done.reward_timeout == 0 and not stats.truncated
    assert len(turns) == len({t.episode for t in turns}) == 32  # one model call per episode (the harness's reply)
    expected: dict[int, list[float]] = {}
    for t in turns:
        g = int(t.episode.split("-")[-2])  # episode ids are <actor>-<random>-<group>-<sample>
        said, answer = tok.decode(t.completion_ids, skip_special_tokens=True).split(), prompts[g].columns["answer"]
        expected.setdefault(g, []).append(sum(a == b for a, b in zip(said, answer.split())) / 2)
    assert {g: sorted(group.rewards) for g, group in enumerate(groups)} == {g: sorted(r) for g, r in expected.items()}


BROKEN = """
import verifiers.v1 as vf
from copy_v1 import CopyHarness
from copy_v1.taskset import CopyConfig, CopyData


class BrokenTask(vf.Task[CopyData]):
    @vf.reward(weight=1.0)
    async def copied(self, trace: vf.Trace) -> float:
        raise RuntimeError("the reward broke")


class BrokenTaskset(vf.Taskset[BrokenTask, CopyConfig]):
    def load(self):
        return [BrokenTask(CopyData(prompt="copy : a b =", answer="a b"), self.config.task)]


__all__ = ["BrokenTaskset", "CopyHarness"]
"""


def test_an_episode_whose_reward_raises_is_the_agents_failure_counted_and_left_unscored(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    (tmp_path / "broken_v1").mkdir()
    (tmp_path / "broken_v1" / "__init__.py").write_text(BROKEN)
    _, groups, _, done, turns, _ = _run([f"task.verifiers_env={tmp_path / 'broken_v1'}", "task.verifiers_args={}",
                                         "task.reward_fail_threshold=1.0"], tmp_path, prompts=2)
    assert done.reward_raised == 16 and len(turns) == 16  # every episode ran its turn, then its scoring failed
    assert groups == [] and done.groups_unscored == 2  # unscored, never the lowest level: nothing of them is sent
