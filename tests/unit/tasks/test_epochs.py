"""task.epochs: seeded permutations, the steps they fill, an actor's walk over them."""

from __future__ import annotations

import pytest

from streamrl import config as config_lib
from streamrl.tasks import epochs


def _cfg(tmp_path, rows: int, *extra: str):
    lines = "".join(f'{{"prompt": "say w{i}", "answer": "w{i}"}}\n' for i in range(rows))
    (tmp_path / "rows.jsonl").write_text(lines)
    (tmp_path / "r.py").write_text("def f(prompts, completions, answer, **kw):\n"
                                   "    return [float(a in c) for a, c in zip(answer, completions)]\n")
    return config_lib.load(None, ["task.name=dataset", f"task.data={tmp_path / 'rows.jsonl'}",
                                  f"task.reward={tmp_path / 'r.py'}:f", "task.reward_levels=[0.0, 1.0]", "advantage.r_min_correct=1.0",
                                  *extra])


def test_an_epoch_is_a_permutation_fixed_by_seed_and_epoch():
    a = epochs.order(50, seed=3, epoch=0)
    assert sorted(a) == list(range(50))
    assert a == epochs.order(50, seed=3, epoch=0)
    assert a != epochs.order(50, seed=3, epoch=1) and a != epochs.order(50, seed=4, epoch=0)


def test_planned_steps_cover_every_epoch_and_stop_at_steps():
    assert epochs.planned_steps(300, rows=64, epochs=2, batch_groups=8) == 16
    assert epochs.planned_steps(300, rows=65, epochs=1, batch_groups=8) == 9  # the last step takes the remainder
    assert epochs.planned_steps(5, rows=64, epochs=2, batch_groups=8) == 5
    assert epochs.planned_steps(300, rows=64, epochs=0, batch_groups=8) == 300


def test_the_steps_follow_from_the_rows_and_are_described(tmp_path):
    cfg = _cfg(tmp_path, 64, "task.epochs=2", "learner.batch_groups=8")
    assert epochs.rows_of(cfg) == 64
    planned = epochs.plan(cfg, 64)
    assert planned.steps == 16 and "16 steps" in epochs.describe(planned, 64)
    assert epochs.plan(_cfg(tmp_path, 64, "learner.batch_groups=8"), 64).steps == cfg.steps  # no epochs: as set
    short = epochs.plan(_cfg(tmp_path, 64, "task.epochs=2", "learner.batch_groups=8", "steps=3"), 64)
    assert short.steps == 3 and "steps=3 ends it first" in epochs.describe(short, 64)


def test_epochs_without_a_data_file_are_refused_by_name():
    with pytest.raises(config_lib.ConfigError, match="epochs=2: epochs pass over task.data"):
        config_lib.load(None, ["task.epochs=2"])
