"""The skyrl_gym and openenv task settings: the examples load, and what each task needs is said up front."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrl.config import ConfigError, load

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = [REPO / "examples" / "skyrl-gym-copy" / "config.yaml", REPO / "examples" / "openenv-copy" / "config.yaml"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.parent.name)
def test_the_ecosystem_examples_load_as_multi_turn_tasks(path):
    cfg = load(path)
    assert cfg.task.name in ("skyrl_gym", "openenv") and cfg.task.max_turns == 2


@pytest.mark.parametrize("overrides, said", [
    (["task.name=skyrl_gym", "task.data=x.jsonl", "task.reward_levels=[0,1]"], "needs task.environment"),
    (["task.name=skyrl_gym", "task.environment=gsm8k", "task.reward_levels=[0,1]"], "needs task.data"),
    (["task.name=openenv", "task.data=x.jsonl", "task.reward_levels=[0,1]"], "exactly one of task.env_url"),
    (["task.name=openenv", "task.data=x.jsonl", "task.env_url=http://127.0.0.1:1", "task.env_app=s.py:app",
      "task.reward_levels=[0,1]"], "exactly one of task.env_url"),
    (["task.name=skyrl_gym", "task.data=x.jsonl", "task.environment=gsm8k"], "reward_levels"),
    (["task.name=openenv", "task.data=x.jsonl", "task.env_url=http://127.0.0.1:1", "task.reward_levels=[0,1]",
      "advantage.r_min_correct=1", "eval.every=5"], "multi-turn episodes do not combine"),
])
def test_what_an_ecosystem_task_lacks_is_named(overrides, said):
    with pytest.raises(ConfigError, match=said):
        load(None, overrides)
