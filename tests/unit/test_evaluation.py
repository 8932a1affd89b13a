"""streamrl.evaluation: pass@k is the unbiased estimator, mean@k the mean of the first k rewards."""

from __future__ import annotations

import itertools
import math

import pytest

from streamrl import config, evaluation, rewards
from streamrl.evaluation import mean_at_k, pass_at_k


def test_pass_at_k_matches_a_hand_value():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(5, 2)) == pytest.approx(0.7)


@pytest.mark.parametrize("n,c,k", [(n, c, k) for n in (1, 4, 10, 50) for c in range(0, n + 1, max(1, n // 5))
                                   for k in (1, 2, n) if k <= n])
def test_pass_at_k_equals_its_closed_form(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_equals_the_share_of_k_subsets_holding_a_correct_sample():
    correct = [1, 0, 0, 1, 0, 0]
    subsets = list(itertools.combinations(correct, 3))
    assert pass_at_k(6, 2, 3) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


def test_pass_at_k_is_one_when_all_are_correct_and_zero_when_none_are():
    assert pass_at_k(8, 8, 1) == pass_at_k(8, 8, 8) == 1.0
    assert pass_at_k(8, 0, 1) == pass_at_k(8, 0, 8) == 0.0


def test_pass_at_k_is_stable_for_large_n():
    assert pass_at_k(10_000, 1, 1) == pytest.approx(1e-4)
    assert 0 < pass_at_k(100_000, 3, 50) < 1


def test_k_above_n_or_bad_counts_are_refused():
    with pytest.raises(ValueError, match="k=5 must be 1..n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="k=0"):
        pass_at_k(4, 1, 0)
    with pytest.raises(ValueError, match="c=5"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="k=4"):
        mean_at_k([[0.0, 1.0, 1.0]], 4)


def test_mean_at_k_averages_each_prompts_first_k_rewards_then_the_prompts():
    table = [[1.0, 0.0, 0.5, 0.5],
             [0.25, 0.25, 1.0, 1.0]]
    assert mean_at_k(table, 1) == pytest.approx((1.0 + 0.25) / 2)
    assert mean_at_k(table, 2) == pytest.approx((0.5 + 0.25) / 2)
    assert mean_at_k(table, 4) == pytest.approx((0.5 + 0.625) / 2)


def test_summarize_counts_rewards_at_the_threshold_as_correct():
    table = [[0.75, 0.5], [0.0, 0.25]]
    out = evaluation.summarize(table, r_min_correct=0.75, ks=[1, 2])
    assert out["eval/pass@1"] == pytest.approx(0.25) and out["eval/pass@2"] == pytest.approx(0.5)
    assert out["eval/mean@2"] == out["eval/reward_mean"] == pytest.approx(1.5 / 4)
    assert out["eval/prompts"] == 2


def test_an_evaluation_is_reproducible_and_leaves_the_callers_rng_alone():
    import torch

    cfg = config.load(None, ["eval.prompts=4", "eval.samples=4", "eval.ks=[1,4]"])
    ev = evaluation.Evaluator(cfg, rewards.build(cfg))
    torch.manual_seed(7)
    first = ev.run()
    after = torch.rand(1)
    torch.manual_seed(7)
    second = ev.run()
    assert torch.equal(torch.rand(1), after)
    first.pop("eval_s"), second.pop("eval_s")
    assert first == second
    assert set(first) == {"eval/pass@1", "eval/pass@4", "eval/mean@1", "eval/mean@4", "eval/reward_mean",
                          "eval/prompts", "eval/samples", "eval/unparseable"}
    assert 0 <= first["eval/pass@1"] <= first["eval/pass@4"] <= 1 and first["eval/prompts"] == 4
