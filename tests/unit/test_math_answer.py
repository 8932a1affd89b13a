import json

import pytest

from streamrl.tasks import math_answer


@pytest.mark.parametrize("text, answer", [
    ("so x = 3, and \\boxed{42}", "42"),
    ("\\boxed{\\frac{1}{2}} wait no \\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),
    ("the total is 1,250 dollars", "1,250"),
    ("no answer here", None),
])
def test_final_answer_is_the_last_boxed_or_the_last_number(text, answer):
    assert math_answer.final_answer(text) == answer


def test_reward_is_one_exactly_when_the_answer_matches(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"problem": "What is 2.5 + 2.5?", "answer": "5"}) + "\n")
    task = math_answer.MathAnswer(str(path))
    p = task.sample(__import__("random").Random(0))
    assert "\\boxed{}" in p.text and "What is 2.5 + 2.5?" in p.text
    assert task.score(p, "2.5 + 2.5 = \\boxed{5.0}") == 1.0
    assert task.score(p, "\\boxed{6}") == 0.0 and task.unparseable == 0
    assert task.score(p, "I am not sure") == 0.0 and task.unparseable == 1


def test_math_needs_data_and_names_a_bad_row(tmp_path):
    with pytest.raises(ValueError, match="needs task.data"):
        math_answer.MathAnswer(None)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: .*answer"):
        math_answer.read_jsonl(bad)
