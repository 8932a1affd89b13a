"""streamrl.tasks (targets, partial credit, levels, seeded prompts) and the offline tokenizer/model."""

from __future__ import annotations

import random

import pytest

from streamrl import config, tasks
from streamrl.models import model
from streamrl.tasks import Prompt, symbols


def _prompt(target: str) -> Prompt:
    return Prompt(id="x", text="unused", target=tuple(target.split()))


@pytest.mark.parametrize("name,seq,want", [
    ("copy", "a b c d", "a b c d"),
    ("reverse", "a b c d", "d c b a"),
    ("repeat_first", "c a b d", "c c c c"),
    ("reverse", "a a b", "b a a"),
])
def test_symbol_task_targets(name, seq, want):
    task = tasks.TASKS.get(name)(num_symbols=4, length=len(seq.split()))
    assert task.transform(seq.split()) == want.split()


def test_sampled_prompt_text_id_and_target_agree():
    task = tasks.TASKS.get("reverse")(num_symbols=4, length=5)
    p = task.sample(random.Random(3))
    words = p.text.split()
    assert words[:2] == ["reverse", ":"] and words[-1] == "="
    seq = words[2:-1]
    assert len(seq) == 5 and set(seq) <= {"a", "b", "c", "d"}
    assert p.target == tuple(reversed(seq))
    assert p.id == "reverse-" + "".join(seq)


def test_score_gives_partial_credit_per_position():
    p = _prompt("a b c d")
    assert symbols.Copy(4, 4).score(p, "a b c d") == 1.0
    assert symbols.Copy(4, 4).score(p, "a b x d") == 0.75
    assert symbols.Copy(4, 4).score(p, "a x x x") == 0.25
    assert symbols.Copy(4, 4).score(p, "b c d a") == 0.0  # right symbols, wrong places
    assert symbols.Copy(4, 4).score(p, "") == 0.0


def test_score_of_a_short_completion_counts_only_what_is_there():
    assert symbols.Copy(4, 4).score(_prompt("a b c d"), "a b") == 0.5


def test_score_ignores_extra_words():
    p = _prompt("a b c d")
    assert symbols.Copy(4, 4).score(p, "a b c d d d <eos> junk") == 1.0
    assert symbols.Copy(4, 4).score(p, "a b x d extra") == 0.75


def test_score_splits_on_any_whitespace():
    assert symbols.Copy(4, 4).score(_prompt("a b c d"), "  a\tb\nc  d ") == 1.0


@pytest.mark.parametrize("length,levels", [(1, [0.0, 1.0]), (4, [0.0, 0.25, 0.5, 0.75, 1.0]),
                                           (5, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0])])
def test_reward_levels_are_multiples_of_one_over_length(length, levels):
    assert symbols.Copy(4, length).reward_levels == pytest.approx(levels)


def test_every_score_is_a_reward_level():
    task = symbols.Reverse(3, 4)
    rng = random.Random(0)
    for _ in range(50):
        p = task.sample(rng)
        guess = " ".join(rng.choice(task.symbols) for _ in range(rng.randint(0, 6)))
        assert task.score(p, guess) in task.reward_levels


def test_prompts_are_deterministic_for_a_seeded_random():
    task = symbols.Copy(4, 4)
    a = [task.sample(random.Random(42)) for _ in range(3)]
    r1, r2 = random.Random(7), random.Random(7)
    assert [task.sample(r1) for _ in range(20)] == [task.sample(r2) for _ in range(20)]
    assert a[0] == a[1] == a[2]
    r3, r4 = random.Random(7), random.Random(8)
    assert [task.sample(r3) for _ in range(20)] != [task.sample(r4) for _ in range(20)]


def test_build_follows_the_task_config():
    task = tasks.build(config.load(None, ["task.name=repeat_first", "task.num_symbols=3", "task.length=6",
                                          "advantage.r_min_correct=0.5"]).task)
    assert isinstance(task, symbols.RepeatFirst)
    assert task.symbols == ["a", "b", "c"] and task.length == 6


def test_unknown_task_lists_valid_ones():
    with pytest.raises(KeyError, match="valid: agent, code_verifier, copy, dataset, lookup, math, openenv, reasoning_gym, repeat_first, reverse, skyrl_gym"):
        tasks.TASKS.get("sort")


# --- the offline tokenizer and tiny model built from the task vocabulary -------------------------


@pytest.fixture(scope="module")
def tiny():
    cfg = config.load(None)
    m, tok = model.build(cfg)
    return cfg, m, tok


@pytest.mark.parametrize("name", ["copy", "reverse", "repeat_first"])
def test_every_prompt_and_target_tokenizes_without_unknown_words(name, tiny):
    _, _, tok = tiny
    task = tasks.TASKS.get(name)(num_symbols=4, length=4)
    rng = random.Random(0)
    for _ in range(20):
        p = task.sample(rng)
        ids = tok(p.text, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids
        assert len(ids) == len(p.text.split())
        target_ids = tok(" ".join(p.target), add_special_tokens=False)["input_ids"]
        # decoding what a perfect policy samples scores full marks
        assert task.score(p, tok.decode(target_ids + [tok.eos_token_id], skip_special_tokens=True)) == 1.0


def test_tiny_model_matches_tokenizer_and_config(tiny):
    cfg, m, tok = tiny
    assert model.vocab_size(m) == len(tok)
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1
    assert m.config.hidden_size == cfg.model.hidden_size
    assert m.config.num_hidden_layers == cfg.model.num_layers
