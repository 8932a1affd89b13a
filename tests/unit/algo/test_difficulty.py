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


def test_offline_filtering_refuses_prompts_without_room_and_cuts_completions_where_the_actors_do(tmp_path,
                                                                                             monkeypatch):
    """model.max_seq_len bounds difficulty sampling as it bounds the actors (streamrl.models.prompting.room): a
    prompt that leaves no room is not sampled and is counted as too long; the others' completions are cut at their
    room. Real sampling of the tiny model, which writes whatever it samples."""
    from streamrl import evaluation
    from streamrl.models import model as model_lib
    from streamrl.models import prompting
    from streamrl.tasks import rewards

    def cfg(*extra):
        return config.load(None, ["task.length=4", "actors.max_new_tokens=8", "difficulty.low=0", "difficulty.high=1",
                                  *extra])

    reward = rewards.build(cfg())
    _, tokenizer = model_lib.build(cfg(), reward.task.vocabulary)
    encode = prompting.PromptEncoder.from_config(cfg(), tokenizer)
    (length,) = {len(encode(p)) for p in reward.task.eval_set(4, cfg().eval.seed)}   # copy prompts: one length
    counts = offline_difficulty.filter_offline(cfg(f"model.max_seq_len={length}"), rollouts=2,
                                               out=tmp_path / "kept.jsonl", prompts=4)
    assert (counts["prompts"], counts["too_long"], counts["kept"]) == (4, 4, 0)
    assert (tmp_path / "kept.jsonl").read_text() == ""

    seen: list = []
    real = evaluation.sample_scored
    monkeypatch.setattr(evaluation, "sample_scored", lambda *a, **kw: real(*a, drawn=seen, **kw))
    counts = offline_difficulty.filter_offline(cfg(f"model.max_seq_len={length + 2}"), rollouts=2,
                                               out=tmp_path / "kept.jsonl", prompts=4)
    assert counts["too_long"] == 0 and counts["kept"] == 4 and len(seen) == 8
    assert all(len(p) + len(c.tokens) <= length + 2 for p, c in seen)    # no sample past the whole-sequence cap
    assert any(len(c.tokens) == 2 and c.finish_reason == "length" for _, c in seen)   # cut there, not at 8
    counts = offline_difficulty.filter_offline(cfg(f"model.max_prompt_tokens={length - 1}"), rollouts=2,
                                               out=tmp_path / "kept.jsonl", prompts=4)
    assert counts["too_long"] == 4


def test_max_prompt_tokens_refuses_a_longer_prompt_in_the_actors_rule():
    from streamrl.models import prompting

    from streamrl.actors import rollout

    assert prompting.room(10, 8, None, max_prompt_tokens=9) == 0
    assert prompting.room(9, 8, 16, max_prompt_tokens=9) == 7
    opts = rollout.RolloutOptions(group_size=1, r_min_correct=1.0, max_new_tokens=8, max_prompt_tokens=9)
    assert opts.room([0] * 10) == 0 and opts.room([0] * 9) == 8   # the actors skip and count a longer prompt
    assert opts.room([0] * 10, prompt=False) == 8                 # an MGRPO layer-2 query is not a task prompt
