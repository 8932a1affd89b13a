"""streamrl.commands.uplift: samples are ranked by initial log-prob and bucketed; ratios are exact."""

from __future__ import annotations

import math

import pytest

from streamrl.commands.uplift import buckets, distinct_correct, ranks_within


def test_samples_are_ranked_by_initial_log_prob_highest_first_and_split_into_equal_buckets():
    pre = [-1.0, -5.0, -2.0, -4.0, -3.0, -6.0]
    post = [-1.0, -3.0, -2.0, -2.0, -3.0, -5.0]  # log ratios by rank: 0, 0, 0, +2, +2, +1
    got = buckets(pre, post, 3)
    assert [(b["bucket"], b["rank_lo"], b["rank_hi"], b["count"]) for b in got] == [(0, 0, 1, 2), (1, 2, 3, 2),
                                                                                      (2, 4, 5, 2)]
    assert [b["mean_log_ratio"] for b in got] == pytest.approx([0.0, 1.0, 1.5])
    assert [b["geo_mean_ratio"] for b in got] == pytest.approx([1.0, math.e, math.exp(1.5)])
    assert [b["mean_ratio"] for b in got] == pytest.approx([1.0, (1 + math.exp(2)) / 2, (math.exp(2) + math.e) / 2])


def test_uneven_counts_differ_by_at_most_one_and_cover_every_rank():
    got = buckets([-float(i) for i in range(10)], [0.0] * 10, 4)
    assert [b["count"] for b in got] == [2, 3, 2, 3]
    assert [(b["rank_lo"], b["rank_hi"]) for b in got] == [(0, 1), (2, 4), (5, 6), (7, 9)]


def test_fewer_samples_than_buckets_give_one_bucket_per_sample():
    got = buckets([-2.0, -1.0], [-1.0, -1.0], 5)
    assert [(b["count"], b["mean_log_ratio"]) for b in got] == [(1, 0.0), (1, 1.0)]


def test_a_huge_ratio_is_null_rather_than_infinite():
    got = buckets([-2000.0], [0.0], 1)
    assert got[0]["mean_log_ratio"] == 2000.0 and got[0]["geo_mean_ratio"] is None and got[0]["mean_ratio"] is None


def test_mismatched_inputs_are_refused():
    with pytest.raises(ValueError, match="2 pre log-probs but 1 post"):
        buckets([-1.0, -2.0], [-1.0], 2)


def test_ranks_are_within_each_prompt_not_across_prompts():
    # Prompt "a" is long (low log-probs), prompt "b" short: a global rank would put all of b first.
    prompt_of = ["a", "a", "b", "b", "a"]
    pre = [-50.0, -40.0, -2.0, -1.0, -45.0]
    assert ranks_within(prompt_of, pre) == [2, 0, 1, 0, 1]
    post = [-50.0, -38.0, -2.0, -0.5, -45.0]   # log ratios: a: 0, +2, 0; b: 0, +0.5
    got = buckets(pre, post, 3, prompt_of)
    assert [(b["rank_lo"], b["rank_hi"], b["count"]) for b in got] == [(0, 0, 2), (1, 1, 2), (2, 2, 1)]
    assert [b["mean_log_ratio"] for b in got] == pytest.approx([(2 + 0.5) / 2, 0.0, 0.0])


def test_a_correct_answer_sampled_twice_is_ranked_once_per_prompt():
    drawn = [[([1, 2], True), ([1, 2], True), ([3], False), ([4], True)],
             [([1, 2], True), ([1, 2], False)]]            # the same tokens under another prompt are another answer
    owner, kept, repeats = distinct_correct(drawn)
    assert owner == [0, 0, 1] and kept == [[1, 2], [4], [1, 2]] and repeats == 1
