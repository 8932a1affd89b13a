import json
import math
import random

import pytest

from streamrl.tasks import Prompt, rewards, verifier

PAIR_B_RIGHT = Prompt(id="p", text="", labels=(0.0, 1.0))
PAIR_A_RIGHT = Prompt(id="p", text="", labels=(1.0, 0.0))
SINGLE_RIGHT = Prompt(id="s", text="", labels=(1.0,))


def task(steps=10):
    return verifier.CodeVerifier(scale_steps=steps)


@pytest.mark.parametrize("text, prompt, reward", [
    ("B is right because A overflows. A: 0 B: 10", PAIR_B_RIGHT, 1.0),   # certain and right
    ("A: 10 B: 0", PAIR_B_RIGHT, 0.0),                                   # certain and wrong: lowest
    ("A: 5 B: 5", PAIR_B_RIGHT, 0.5),                                    # undecided
    ("A: 3 B: 7", PAIR_B_RIGHT, 0.7),                                    # p = 0.7
    ("A: 7 B: 3", PAIR_A_RIGHT, 0.7),                                    # label 1[y_B > y_A] = 0
    ("first A: 0 B: 10, on reflection A: 8, B: 2", PAIR_A_RIGHT, 0.8),   # the last statement counts
    ("Rating: 9", SINGLE_RIGHT, 0.9),
    ("Rating: 2", Prompt(id="s", text="", labels=(0.0,)), 0.8),
])
def test_reward_on_hand_made_outputs(text, prompt, reward):
    assert task().score(prompt, text) == pytest.approx(reward)


def test_bce_is_minus_ln_of_the_probability_the_ratings_give_the_label():
    # p = (1 + (7 - 3)/10) / 2 = 0.7 for y = 1: BCE = -ln 0.7
    assert verifier.bce((3, 7), (0, 1)) == pytest.approx(-math.log(0.7))
    assert verifier.bce((4, 5), (1, 0)) == pytest.approx(-math.log(1 - 0.55))
    assert verifier.bce((8, 8), (1, 1)) == pytest.approx(-math.log(0.8))   # a tie: the mean of two single BCEs


def test_the_paper_configs_reward_is_minus_bce_and_goes_negative():
    # The paper's section 2.3: a failed trajectory has R(y_f) < 0. Under the bce form every reward is ln q <= 0.
    reward = rewards.Reward(verifier.CodeVerifier(reward_form="bce"))
    assert reward(PAIR_B_RIGHT, "A: 3 B: 7") == pytest.approx(math.log(0.7))
    assert reward(PAIR_B_RIGHT, "A: 0 B: 10") == 0.0
    assert reward(PAIR_B_RIGHT, "A: 10 B: 0") == pytest.approx(math.log(verifier.EPS))   # finite, the lowest
    assert reward.levels[0] == pytest.approx(math.log(1e-3)) and reward.levels[-1] == 0.0
    exp = rewards.Reward(verifier.CodeVerifier(reward_form="exp"))
    assert exp(PAIR_B_RIGHT, "A: 3 B: 7") == pytest.approx(0.7)   # exp(-BCE), the option
    four = rewards.Reward(verifier.CodeVerifier(reward_form="bce"), [0.3, 0.6, 0.9])
    assert four.levels == pytest.approx([math.log(1e-3), math.log(1 / 3), math.log(2 / 3), 0.0])


@pytest.mark.parametrize("a, b, level", [
    (7.5, 2.5, 0.3),   # d = -5: q = 0.25, half up -> 0.3
    (7, 3, 0.3),       # d = -4: q = 0.30
    (6.5, 3.5, 0.4),   # d = -3: q = 0.35, half up -> 0.4 (float noise used to put it on 0.3)
    (6, 4, 0.4),
    (5.5, 4.5, 0.5),   # q = 0.45 -> 0.5
])
def test_ratings_are_quantised_exactly(a, b, level):
    assert task().score(PAIR_B_RIGHT, f"A: {a} B: {b}") == level


@pytest.mark.parametrize("labels, text, level", [
    ((1.0, 1.0), "A: 10 B: 10", 1.0),   # both correct, rated so: right
    ((1.0, 1.0), "A: 8 B: 8", 0.8),
    ((1.0, 1.0), "A: 10 B: 0", 0.0),    # one of two correct answers rated 0
    ((0.0, 0.0), "A: 0 B: 0", 1.0),     # both incorrect, rated so
    ((0.0, 0.0), "A: 10 B: 10", 0.0),   # both incorrect but rated perfect: equal ratings alone are not right
    ((0.0, 0.0), "A: 1 B: 3", 0.8),     # sqrt(0.9 * 0.7) = 0.794 -> 0.8
])
def test_a_tie_is_judged_response_by_response_as_its_labels_say(labels, text, level):
    assert task().score(Prompt(id="t", text="", labels=labels), text) == level


@pytest.mark.parametrize("labels, category", [
    ((1.0, 0.0), "first_correct"), ((0.0, 1.0), "second_correct"), ((1.0, 1.0), "both_correct"),
    ((0.0, 0.0), "both_incorrect"), ((1.0,), "single"), ((0.0,), "single"),
])
def test_each_prompt_falls_in_one_of_the_papers_categories(labels, category):
    assert verifier.category(labels) == category


@pytest.mark.parametrize("text", ["", "I think B", "A: 11 B: 0", "A: -1 B: 3", "B: 3 A: 4", "Rating: 5"])
def test_unparseable_output_gets_the_lowest_reward_and_is_counted(text):
    t = task()
    assert t.score(PAIR_B_RIGHT, text) == 0.0
    assert t.unparseable == 1


def test_quantisation_follows_the_scale():
    assert task(4).score(PAIR_B_RIGHT, "A: 3 B: 7") == 0.75     # 0.7 on a 4-step scale
    assert task(4).reward_levels == [0, 0.25, 0.5, 0.75, 1.0]


def test_jsonl_reader_builds_pair_and_single_prompts(tmp_path):
    rows = [{"question": "reverse a list", "response_a": "x[::-1]", "response_b": "x.sort()",
             "label_a": 1, "label_b": 0},
            {"question": "sum", "response_a": "a+b", "label_a": 1}]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    t = verifier.CodeVerifier(data=str(path))
    seen = {t.sample(random.Random(i)).labels for i in range(20)}
    assert seen == {(1.0, 0.0), (1.0,)}
    pair = t.prompt(verifier.read_jsonl(path)[0])
    assert "x[::-1]" in pair.text and "x.sort()" in pair.text and "A: <rating> B: <rating>" in pair.text
    assert pair.id == t.prompt(verifier.read_jsonl(path)[0]).id   # stable across processes


@pytest.mark.parametrize("line, msg", [
    ('{"question": "q", "response_a": "a"}', "label_a"),
    ('{"question": "q", "response_a": "a", "label_a": 1, "response_b": "b"}', "come together"),
    ("not json", "line 1|:1:"),
])
def test_a_bad_jsonl_row_names_file_and_line(tmp_path, line, msg):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=msg) as e:
        verifier.read_jsonl(path)
    assert f"{path}:1:" in str(e.value)


def test_synthetic_set_labels_the_right_answer():
    t = task()
    for i in range(50):
        p = t.sample(random.Random(i))
        q = p.text.split("Question: sum ")[1].split("\n")[0].split()
        right = str(int(q[0]) + int(q[1]))
        answers = [line.split(": ")[1] for line in p.text.splitlines() if line.startswith("Response")]
        assert [float(a == right) for a in answers] == list(p.labels)


def test_the_documented_sample_file_reads():
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "docs" / "reference" / "verifier-sample.jsonl"
    rows = verifier.read_jsonl(path)
    assert {r.response_b is None for r in rows} == {True, False}
    t = verifier.CodeVerifier(data=str(path))
    assert "def f(xs)" in t.prompt(rows[0]).text and "def f(xs)" in " ".join(t.vocabulary)


# --- the choices the paper leaves open, each with its key (issue 29, item 3) -----------------------

@pytest.mark.parametrize("a, b, up, down", [
    (5.5, 4.5, 0.5, 0.4),   # q = 0.45, exactly halfway: a verdict one point wrong is a tie only when rounding up
    (7.5, 2.5, 0.3, 0.2),   # q = 0.25
    (6, 4, 0.4, 0.4),       # q = 0.40 is a level: no rounding either way
    (6.2, 3.8, 0.4, 0.4),   # q = 0.38: nearest, not halfway
])
def test_task_rounding_says_where_a_q_exactly_halfway_goes(a, b, up, down):
    half_down = verifier.CodeVerifier(rounding="half_down")
    assert task().score(PAIR_B_RIGHT, f"A: {a} B: {b}") == up
    assert half_down.score(PAIR_B_RIGHT, f"A: {a} B: {b}") == down


def test_task_rounding_half_down_also_applies_to_ties_judged_response_by_response():
    # labels tie (both correct): q = sqrt(q_A q_B); ratings 5 and 4.5 give sqrt(0.5 * 0.45) = 0.474... (not halfway),
    # sqrt(0.81 * 0.25) = 0.45 exactly: halfway between 0.4 and 0.5
    both = Prompt(id="t", text="", labels=(1.0, 1.0))
    assert task().score(both, "A: 8.1 B: 2.5") == 0.5
    assert verifier.CodeVerifier(rounding="half_down").score(both, "A: 8.1 B: 2.5") == 0.4
    assert verifier.CodeVerifier(rounding="half_down").score(both, "A: 5 B: 4.5") == 0.5


def test_task_bce_floor_sets_the_reward_of_q_zero_and_is_checked_against_the_scale():
    from streamrl import config

    cfg = config.load(None, ["task.name=code_verifier", "advantage.r_min_correct=-0.5108256237659907",
                             "task.bce_floor=0.01"])
    reward = rewards.build(cfg)
    assert reward(PAIR_B_RIGHT, "A: 10 B: 0") == pytest.approx(math.log(0.01))   # not ln 1e-3
    assert reward.levels[0] == pytest.approx(math.log(0.01))
    with pytest.raises(config.ConfigError, match=r"task.bce_floor=0.1: must be below the scale's first step"):
        config.load(None, ["task.name=code_verifier", "task.bce_floor=0.1"])
