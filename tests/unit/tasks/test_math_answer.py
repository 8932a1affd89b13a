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


def _old_verdict(got: str, reference: str) -> bool:
    """What the hand-written normaliser alone said (the comparison before math-verify)."""
    return math_answer.normalise(got) == math_answer.normalise(reference)


# (completion's final answer, reference, same answer?): the cases the old normaliser got wrong...
OLD_WRONG = [
    ("0.5", "\\frac{1}{2}", True),
    ("\\dfrac{1}{2}", "\\frac{1}{2}", True),
    ("x=5", "5", True),
    ("5", "x = 5", True),
    ("0.75", "\\frac{3}{4}", True),
    ("\\frac12", "1/2", True),
    ("\\sqrt2", "\\sqrt{2}", True),
    ("\\frac{\\pi}{2}", "\\pi/2", True),
    ("1000", "10^{3}", True),
    ("\\{2,1\\}", "\\{1,2\\}", True),
    ("\\$5", "5", True),
]
# ... and the ones it got right, which must stay right.
OLD_RIGHT = [
    ("5.0", "5", True),
    ("1250", "1,250", True),
    ("2.50", "2.5", True),
    ("$5$", "5", True),
    ("yes", "\\text{yes}", True),
    ("4", "3", False),
    ("-3", "3", False),
    ("0.33", "\\frac{1}{3}", False),
    ("y=5", "x=5", False),
    ("no", "yes", False),
]


@pytest.mark.parametrize("got, reference, same", OLD_WRONG)
def test_math_verify_fixes_what_the_old_normaliser_got_wrong(got, reference, same):
    assert _old_verdict(got, reference) != same  # the table's premise: the old comparison erred here
    assert math_answer.same_answer(got, reference) == same


@pytest.mark.parametrize("got, reference, same", OLD_RIGHT)
def test_math_verify_keeps_what_the_old_normaliser_got_right(got, reference, same):
    assert _old_verdict(got, reference) == same
    assert math_answer.same_answer(got, reference) == same


def test_the_math_reward_uses_math_verify_in_a_worker_thread_too(tmp_path):
    """math-verify's own timeouts need the main thread; a reward pool calls from workers."""
    import concurrent.futures

    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"problem": "Half of one?", "answer": "\\frac{1}{2}"}) + "\n")
    task = math_answer.MathAnswer(str(path))
    p = task.sample(__import__("random").Random(0))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda c: task.score(p, c), ["so \\boxed{0.5}", "\\boxed{\\dfrac{1}{2}}", "\\boxed{2}"]))
    assert got == [1.0, 1.0, 0.0]
