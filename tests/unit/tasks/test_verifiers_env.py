"""task.name: verifiers (streamrl.tasks.verifiers_env): a classic verifiers Environment loaded by id, file or
module, its dataset as the rows, its rubric's weighted reward snapped to the declared levels."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrl.config import TaskConfig
from streamrl.tasks.verifiers_env import VerifiersTask, load, nearest

vf = pytest.importorskip("verifiers.legacy")
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "verifiers-copy" / "copy_env.py"


def test_a_weighted_reward_snaps_to_the_nearest_level_ties_down():
    levels = [0.0, 0.25, 0.5, 0.75, 1.0]
    assert nearest(0.74999, levels) == 0.75 and nearest(0.3, levels) == 0.25 and nearest(1.7, levels) == 1.0
    assert nearest(0.125, levels) == 0.0 and nearest(-2.0, levels) == 0.0


def test_the_environments_own_dataset_is_the_rows_with_its_answers():
    task = VerifiersTask(TaskConfig(name="verifiers", verifiers_env=str(EXAMPLE), verifiers_args={"symbols": "ab",
                                    "length": 2}, reward_levels=[0.0, 0.5, 1.0]))
    assert len(task.train) == 4  # every ab string of length 2
    row = task.train[0]
    assert row.prompt == ({"role": "user", "content": "copy : a a ="},) and row.columns["answer"] == "a a"
    assert "example_id" in row.columns
    assert set(task.vocabulary) == {"copy", ":", "a", "b", "="}  # example ids are no words
    assert task.agent_fn.kind == "verifiers environment" and task.agent_fn.__name__ == "verifiers:copy_env.py"


def test_an_environment_is_named_by_file_by_module_loader_or_installed_id(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    assert isinstance(load(str(EXAMPLE), {}), vf.SingleTurnEnv)
    assert isinstance(load("copy_env:load_environment", {"length": 1}), vf.SingleTurnEnv)
    assert load("copy-env", {"symbols": "xy", "length": 1}).get_dataset().num_rows == 2  # an id: its module
    with pytest.raises(ValueError, match="no installed environment module 'no-such-env'"):
        load("no-such-env", {})
    (tmp_path / "not_env.py").write_text("def load_environment(**kw):\n    return 42\n")
    with pytest.raises(ValueError, match="returned a int, not a verifiers Environment"):
        load(str(tmp_path / "not_env.py"), {})


def test_the_config_asks_for_an_environment_with_the_verifiers_task_only():
    with pytest.raises(ValueError, match="task.name=verifiers needs task.verifiers_env"):
        TaskConfig(name="verifiers")
    with pytest.raises(ValueError, match="only it reads one"):
        TaskConfig(name="copy", verifiers_env="copy_env")
