"""task.name: reasoning_gym: a real reasoning-gym dataset, its own partial credit as the ordinal level."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("reasoning_gym")

from streamrl import tasks
from streamrl.commands import cli
from streamrl.config import ConfigError, load
from streamrl.tasks import procedural, rewards

SPELL = ["task.name=reasoning_gym", "task.dataset=spell_backward", "task.options={size: 6, seed: 1}",
         "advantage.r_min_correct=1.0"]


def test_a_dataset_loads_and_its_partial_credit_is_floored_onto_the_declared_levels():
    cfg = load(None, [*SPELL, "task.scale_steps=4"])
    task = tasks.build(cfg.task)
    assert len(task.ids) == 6 and task.reward_levels == [0.0, 0.25, 0.5, 0.75, 1.0]
    p = task.sample(random.Random(0))
    word = p.text.rsplit(":", 1)[1].strip()
    assert p.target[0] == word[::-1] and "backward" in p.text
    assert task.score(p, p.target[0]) == 1.0
    near = p.target[0][:-1] + "#"  # one letter wrong: partial credit from the library, strictly between
    assert 0 < task.credit(p, near) < 1 and task.score(p, near) == procedural.floor_level(task.credit(p, near), 4)
    assert task.score(p, "zzzzzzzzzzzz") == 0.0
    assert task.score(p, f"let me think <answer>{p.target[0]}</answer>") == 1.0
    assert set(task.reward_levels) >= {task.score(p, c) for c in (near, "x", p.target[0])}


def test_the_levels_come_from_the_config_alone_and_r_min_correct_must_be_one():
    cfg = load(None, SPELL)
    assert cfg.reward_levels() == [i / 10 for i in range(11)]
    with pytest.raises(ConfigError, match="r_min_correct=0.75: not a level"):
        load(None, SPELL[:-1] + ["advantage.r_min_correct=0.75"])


def test_the_same_options_give_the_same_prompts_and_ids():
    cfg = load(None, SPELL)
    a, b = tasks.build(cfg.task), tasks.build(cfg.task)
    assert [a.prompt(i) for i in a.ids] == [b.prompt(i) for i in b.ids]
    assert {p.id for p in a.eval_set(None)} == set(a.ids)
    assert len({p.id for p in a.eval_set(4)}) == 4


def test_the_tiny_vocabulary_holds_every_question_and_answer_word():
    task = tasks.build(load(None, SPELL).task)
    vocab = set(task.vocabulary)
    for pid in task.ids:
        p = task.prompt(pid)
        assert set(p.text.split()) <= vocab and p.target[0] in vocab


@pytest.mark.parametrize("overrides,match", [
    (["task.dataset=spell_backwards"], "unknown reasoning_gym dataset 'spell_backwards'; valid: .*spell_backward"),
    (["task.dataset=null"], "needs task.dataset"),
    (["task.options={size: 3, min_word_len: 30}"], "reasoning_gym 'spell_backward' refused them"),
])
def test_a_bad_dataset_or_option_is_refused_by_name(overrides, match):
    cfg = load(None, [*SPELL, *overrides])
    with pytest.raises(ValueError, match=match):
        tasks.build(cfg.task)


def test_a_scorer_that_raises_is_counted_and_scores_zero(monkeypatch):
    task = tasks.build(load(None, SPELL).task)
    p = task.sample(random.Random(0))

    def boom(answer, entry):
        raise RuntimeError("library bug")

    monkeypatch.setattr(task.data, "score_answer", boom)
    assert task.score(p, "abc") == 0.0 and task.score(p, "abc") == 0.0
    assert task.unparseable == 2


def test_check_prints_a_sample_prompt_and_scores_for_a_right_and_a_wrong_answer(capsys):
    assert cli.main(["check", *SPELL]) == 0
    out = capsys.readouterr().out
    report = [line for line in out.splitlines() if line.startswith("# ")]
    assert report[0].startswith("# reasoning_gym spell_backward: 6 distinct questions; sample prompt:")
    assert any("Spell this word backward" in line for line in report)
    assert "level 1.000" in report[-2] and "right answer" in report[-2]
    assert "wrong answer" in report[-1] and "level 1.000" not in report[-1]
    import yaml

    assert yaml.safe_load(out)["task"]["dataset"] == "spell_backward"  # the comments keep it loadable YAML


def test_check_refuses_an_unknown_dataset_before_printing_anything(capsys):
    assert cli.main(["check", *SPELL, "task.dataset=nope"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "unknown reasoning_gym dataset 'nope'" in err
