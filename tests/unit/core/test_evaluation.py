"""streamrl.evaluation: pass@k is the unbiased estimator, mean@k the share correct among the first k samples,
reward@k the mean of their shaped rewards; per category where the task has categories."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from streamrl import config, evaluation
from streamrl.evaluation import mean_at_k, pass_at_k
from streamrl.tasks import rewards


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
    assert out["eval/reward@2"] == out["eval/reward_mean"] == pytest.approx(1.5 / 4)
    assert out["eval/prompts"] == 2


def test_mean_at_k_is_accuracy_so_two_reward_scales_compare():
    # The same outcomes on a 10-step -BCE scale and on a 4-step one: mean@k agrees, the shaped mean does not.
    ten = [[math.log(0.6), math.log(0.1)], [0.0, math.log(0.9)]]
    four = [[math.log(2 / 3), math.log(1e-3)], [0.0, 0.0]]
    a = evaluation.summarize(ten, math.log(0.6), [1, 2])
    b = evaluation.summarize(four, math.log(2 / 3), [1, 2])
    assert a["eval/mean@2"] == b["eval/mean@2"] == pytest.approx(0.75)
    assert a["eval/mean@1"] == b["eval/mean@1"] == 1.0
    assert a["eval/reward@2"] != pytest.approx(b["eval/reward@2"])


def test_each_category_gets_its_own_metrics():
    table = [[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]]
    out = evaluation.summarize(table, 1.0, [1, 2], ["first_correct", "single", "first_correct"])
    assert out["eval/first_correct/prompts"] == 2 and out["eval/single/prompts"] == 1
    assert out["eval/first_correct/mean@2"] == pytest.approx(0.75) and out["eval/single/pass@2"] == 0.0
    assert out["eval/mean@2"] == pytest.approx(0.5)


def test_all_evaluates_every_row_of_the_eval_file_with_its_categories(tmp_path):
    rows = [{"question": f"q{i}", "response_a": "a", "label_a": i % 2, "response_b": "b", "label_b": 1 - i % 2}
            for i in range(40)] + [{"question": "s", "response_a": "a", "label_a": 1}]
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = config.load(None, ["task.name=code_verifier", f"task.eval_data={path}", "advantage.r_min_correct=0",
                             "eval.prompts=all", "eval.samples=2", "eval.ks=[1,2]", "actors.max_new_tokens=2"])
    out = evaluation.Evaluator(cfg, rewards.build(cfg)).run()
    assert out["eval/prompts"] == 41   # not cut at the default 32
    counts = [out[f"eval/{c}/prompts"] for c in ("first_correct", "second_correct", "single")]
    assert counts == [20, 20, 1]


def test_all_without_an_eval_file_is_one_clear_error():
    cfg = config.load(None, ["eval.prompts=all"])
    with pytest.raises(ValueError, match="eval.prompts=all: .*give a number"):
        evaluation.Evaluator(cfg, rewards.build(cfg))


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
    assert set(first) == {"eval/pass@1", "eval/pass@4", "eval/mean@1", "eval/mean@4", "eval/reward@1",
                          "eval/reward@4", "eval/reward_mean",
                          "eval/prompts", "eval/samples", "eval/unparseable", "eval/prompts_too_long"}
    assert 0 <= first["eval/pass@1"] <= first["eval/pass@4"] <= 1 and first["eval/prompts"] == 4
