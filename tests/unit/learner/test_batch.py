"""learner.batch.collate: completion tokens line up with the positions that predict them."""

from __future__ import annotations

import pytest
import torch

from streamrl.comm.codec import ScoredGroup
from streamrl.learner.batch import collate

PAD = 0


def group(prompt, completions, logprobs, rewards, version=0):
    return ScoredGroup.from_samples(
        prompt_id="p", policy_version=version, actor_id="a", prompt_tokens=prompt, completions=completions,
        logprobs=logprobs, rewards=rewards, finish_reasons=["stop"] * len(completions))


# Group 0: prompt P=3, completions of 2 and 1 tokens. Group 1: prompt P=2, completions of 4 and 2 tokens.
G0 = group([5, 6, 7], [[8, 9], [10]], [[-0.5, -0.25], [-1.0]], [1.0, 0.0], version=4)
G1 = group([5, 6], [[11, 12, 13, 14], [15, 16]], [[-0.125, -2.0, -3.0, -0.75], [-1.5, -0.0625]], [0.5, 0.25],
           version=3)


@pytest.fixture(scope="module")
def batch():
    return collate([G0, G1], pad_id=PAD)


def test_shapes_follow_the_longest_sequence(batch):
    # longest: P=2 + 4 tokens = 6
    assert batch.input_ids.shape == (4, 6)
    assert batch.attention_mask.shape == (4, 6)
    assert batch.completion_mask.shape == (4, 5)
    assert batch.behaviour_logprobs.shape == (4, 5)


def test_rows_are_prompt_then_completion_right_padded_with_the_pad_id(batch):
    assert batch.input_ids.tolist() == [
        [5, 6, 7, 8, 9, PAD],
        [5, 6, 7, 10, PAD, PAD],
        [5, 6, 11, 12, 13, 14],
        [5, 6, 15, 16, PAD, PAD],
    ]
    assert batch.attention_mask.tolist() == [
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 0, 0],
    ]


def test_pad_id_is_the_one_given():
    b = collate([G0], pad_id=99)
    assert b.input_ids[1].tolist() == [5, 6, 7, 10, 99]


@pytest.mark.parametrize("row,g,i", [(0, G0, 0), (1, G0, 1), (2, G1, 0), (3, G1, 1)])
def test_completion_mask_is_one_exactly_at_positions_p_minus_1_to_p_plus_n_minus_2(batch, row, g, i):
    p, n = g.prompt_tokens.size, g.samples[i].num_tokens
    want = torch.zeros(5)
    want[p - 1 : p + n - 1] = 1
    assert torch.equal(batch.completion_mask[row], want)
    # position t predicts token t + 1: the masked positions predict exactly the completion tokens
    predicted = batch.input_ids[row, 1:][batch.completion_mask[row].bool()]
    assert predicted.tolist() == g.sample_tokens(i).tolist()


@pytest.mark.parametrize("row,g,i", [(0, G0, 0), (1, G0, 1), (2, G1, 0), (3, G1, 1)])
def test_behaviour_logprobs_sit_under_the_mask_and_are_zero_elsewhere(batch, row, g, i):
    m = batch.completion_mask[row].bool()
    assert batch.behaviour_logprobs[row][m].tolist() == g.sample_logprobs(i).tolist()
    assert torch.equal(batch.behaviour_logprobs[row][~m], torch.zeros(int((~m).sum())))


def test_hand_written_alignment_of_the_first_row(batch):
    # ids [5, 6, 7, 8, 9, pad]: position 2 (token 7) predicts 8, position 3 (token 8) predicts 9
    assert batch.completion_mask[0].tolist() == [0, 0, 1, 1, 0]
    assert batch.behaviour_logprobs[0].tolist() == [0.0, 0.0, -0.5, -0.25, 0.0]


def test_rewards_are_num_groups_by_group_size(batch):
    assert batch.rewards.shape == (2, 2)
    assert batch.rewards.dtype == torch.float32
    assert batch.rewards.tolist() == [[1.0, 0.0], [0.5, 0.25]]


def test_policy_versions_are_per_group_and_token_count_is_completion_tokens(batch):
    assert batch.policy_versions.tolist() == [4, 3]
    assert batch.num_tokens == 2 + 1 + 4 + 2


def test_an_empty_completion_contributes_no_tokens():
    b = collate([group([5, 6], [[], [7]], [[], [-1.0]], [0.0, 1.0])], pad_id=PAD)
    assert b.completion_mask.tolist() == [[0.0, 0.0], [0.0, 1.0]]
    assert b.input_ids.tolist() == [[5, 6, PAD], [5, 6, 7]]


def test_a_group_with_an_empty_prompt_does_not_crash_collate():
    g = group([], [[3, 4], [5]], [[-1.0, -1.0], [-1.0]], [0.0, 1.0])
    try:
        collate([g], pad_id=PAD)
    except ValueError:
        pass  # a clear refusal is fine; a RuntimeError from tensor slicing is not


def test_version_spans_count_the_samples_that_mixed_policy_versions():
    from streamrl.learner import stepstats

    spanning = ScoredGroup.from_samples(
        prompt_id="p", policy_version=3, actor_id="a", prompt_tokens=[5], completions=[[8], [9]],
        logprobs=[[-0.5], [-0.5]], rewards=[1.0, 0.0], finish_reasons=["stop"] * 2, last_versions=[5, None])
    b = collate([G0, spanning], pad_id=PAD)
    assert b.last_versions.tolist() == [[4, 4], [5, 3]]
    assert stepstats.version_spans(b) == {"version_span_max": 2, "inflight_fraction": 0.25}
    assert stepstats.version_spans(collate([G0, G1], pad_id=PAD)) == {"version_span_max": 0, "inflight_fraction": 0.0}


def test_strict_mode_refuses_a_step_with_a_sample_that_spans_two_versions():
    from streamrl.learner.stepstats import StrictModeViolation, check_strict

    rec = {"step": 7, "lag_max": 0, "version_span_max": 1, "optimizer_steps": 1, "group_kl_behaviour_learner_max": 0.0, "is_ratio_max_abs_dev": 0.0}
    with pytest.raises(StrictModeViolation, match="step 7: a sample spans 2 policy versions"):
        check_strict(rec, 1e-3)


def test_strict_mode_accepts_a_step_skipped_for_a_zero_gradient_and_refuses_a_batch_with_no_step_at_all():
    from streamrl.learner.stepstats import StrictModeViolation, check_strict

    rec = {"step": 7, "lag_max": 0, "version_span_max": 0, "optimizer_steps": 0, "optimizer_skipped": 1,
           "group_kl_behaviour_learner_max": 0.0, "is_ratio_max_abs_dev": 0.0}
    check_strict(rec, 1e-3)  # the weights stayed those the actors sampled from
    with pytest.raises(StrictModeViolation, match="step 7: 0 optimizer steps on one batch"):
        check_strict({**rec, "optimizer_skipped": 0}, 1e-3)


def test_masked_and_row_by_row_filling_give_the_same_batch(monkeypatch):
    import streamrl.learner.batch as batch_mod

    groups = [G0, G1, group([1], [[2] * 7, [3]], [[-0.5] * 7, [-1.0]], [0.0, 1.0], version=5)]
    monkeypatch.setattr(batch_mod, "_ROW_LOOP_MIN_TOKENS", 0)
    rows = collate(groups, pad_id=7)
    monkeypatch.setattr(batch_mod, "_ROW_LOOP_MIN_TOKENS", 10**9)
    masked = collate(groups, pad_id=7)
    for name in ("input_ids", "attention_mask", "completion_mask", "behaviour_logprobs", "last_versions"):
        assert torch.equal(getattr(rows, name), getattr(masked, name)), name


def test_the_reported_reward_is_the_mean_over_scored_samples_and_the_unscored_are_counted():
    from streamrl.learner.stepstats import scored_reward

    rewards = torch.tensor([[1.0, 0.5, 0.0, 0.5], [0.25, 0.25, 0.25, 0.25]])
    scored = [[True, False, True, False], [False, False, False, False]]  # stand-ins: a group mean, a low level
    assert scored_reward(rewards, scored) == {"reward_mean": 0.5, "samples_unscored": 6}
    assert scored_reward(rewards, [[False] * 4] * 2) == {"reward_mean": None, "samples_unscored": 8}
    assert scored_reward(rewards, []) == {"reward_mean": float(rewards.mean()), "samples_unscored": 0}
