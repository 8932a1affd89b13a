"""streamrl.algo.difficulty: prompts outside the success band are excluded once they have enough rollouts."""

from __future__ import annotations

import json

import pytest

from streamrl import config
from streamrl.algo import difficulty
from streamrl.algo.difficulty import SuccessTracker
from streamrl.commands import difficulty as offline_difficulty


def test_a_prompt_is_kept_until_it_has_enough_rollouts():
    t = SuccessTracker(rollouts=8, low=0.1, high=0.9)
    t.observe("p", [1.0] * 4, r_min_correct=0.75)
    assert t.keep("p") and t.rate("p") == 1.0 and t.excluded == 0
    t.observe("p", [1.0] * 4, r_min_correct=0.75)
    assert not t.keep("p") and t.excluded_by_reason == {"too_easy": 1, "too_hard": 0}


def test_too_hard_and_too_easy_prompts_are_excluded_and_counted_once():
    t = SuccessTracker(rollouts=4, low=0.25, high=0.75)
    t.observe("hard", [0.0, 0.5, 0.7, 0.1], r_min_correct=0.75)  # 0/4 below the threshold
    t.observe("easy", [0.75, 1.0, 1.0, 1.0], r_min_correct=0.75)  # 4/4: a reward at the threshold succeeds
    t.observe("easy", [1.0] * 4, r_min_correct=0.75)
    t.observe("mid", [0.0, 1.0, 0.0, 1.0], r_min_correct=0.75)
    assert (t.keep("hard"), t.keep("easy"), t.keep("mid"), t.keep("unseen")) == (False, False, True, True)
    assert t.excluded == 2 and t.excluded_by_reason == {"too_easy": 1, "too_hard": 1}


def test_rates_on_the_band_edges_are_kept():
    t = SuccessTracker(rollouts=10, low=0.1, high=0.9)
    t.observe("low-edge", [1.0] + [0.0] * 9, r_min_correct=0.5)
    t.observe("high-edge", [1.0] * 9 + [0.0], r_min_correct=0.5)
    assert t.keep("low-edge") and t.keep("high-edge")
    assert difficulty.in_band(0.1, 0.1, 0.9) and not difficulty.in_band(0.91, 0.1, 0.9)


def test_a_bad_band_is_refused():
    with pytest.raises(ValueError, match="low=0.9, high=0.1"):
        SuccessTracker(4, 0.9, 0.1)
    with pytest.raises(ValueError, match="rollouts=0"):
        SuccessTracker(0, 0.1, 0.9)


def test_the_tracker_takes_its_band_from_the_config():
    t = SuccessTracker.from_config(config.load(None, ["difficulty.rollouts=3", "difficulty.low=0.2"]))
    assert (t.rollouts, t.low, t.high) == (3, 0.2, 0.9)


def test_offline_filtering_of_a_dataset_writes_the_kept_rows_verbatim(tmp_path, monkeypatch):
    data = tmp_path / "train.jsonl"
    rows = [{"question": f"sum {i} 1", "response_a": str(i + 1), "label_a": 1.0, "response_b": str(i), "label_b": 0.0,
             "extra": i} for i in range(3)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = config.load(None, ["task.name=code_verifier", f"task.data={data}", "actors.max_new_tokens=2",
                             "task.reward_form=exp", "advantage.r_min_correct=1"])

    def fake(model, tok, reward, prompts, n, **kw):  # row 0 always right, row 1 never, row 2 half the time
        return [[1.0] * n, [0.0] * n, [1.0, 0.0] * (n // 2)][:len(prompts)]

    monkeypatch.setattr("streamrl.evaluation.sample_rewards", fake)
    counts = offline_difficulty.filter_offline(cfg, rollouts=4, out=tmp_path / "kept.jsonl")
    assert (counts["prompts"], counts["kept"], counts["too_easy"], counts["too_hard"]) == (3, 1, 1, 1)
    assert [json.loads(line) for line in (tmp_path / "kept.jsonl").read_text().splitlines()] == [rows[2]]
