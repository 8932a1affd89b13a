"""streamrl.algo.learning_signal on a hand-made batch."""

from __future__ import annotations

import math

import pytest
import torch

from streamrl.algo import learning_signal as learning_signal_module
from streamrl.algo.learning_signal import learning_signal

R_MIN = 0.75

# Group 0: R = [1, 1, 0.5, 1], mean 0.875 >= 0.75 (not in the CoRPO phase).
# Group 1: R = [0.25, 0.5, 0.5, 0.25], mean 0.375 < 0.75 (CoRPO phase: baseline clamped).
REWARDS = torch.tensor([[1.0, 1.0, 0.5, 1.0], [0.25, 0.5, 0.5, 0.25]])
# GRPO advantages of those groups (R - mean), so that failed samples get A > 0 in group 1.
ADV = torch.tensor([[0.125, 0.125, -0.375, 0.125], [-0.125, 0.125, 0.125, -0.125]])
# Per-sample summed losses (signs as a PG loss would have them, magnitudes chosen by hand).
LOSS = torch.tensor([[-1.0, -2.0, 3.0, -1.0], [0.5, -0.5, -0.5, 0.5]])


def test_learning_signal_matches_hand_computed_values():
    s = learning_signal(REWARDS, ADV, LOSS, R_MIN)
    # A > 0: group 0 samples 0, 1, 3 and group 1 samples 1, 2 -> 5; A < 0: 1 + 2 = 3.
    assert s["adv_pos"] == 5 and s["adv_neg"] == 3 and s["adv_zero"] == 0
    assert s["r_count"] == pytest.approx(5 / 3)
    # |loss| of A > 0 samples: 1 + 2 + 1 + 0.5 + 0.5 = 5; of A < 0 samples: 3 + 0.5 + 0.5 = 4.
    assert s["r_loss"] == pytest.approx(5 / 4)
    assert s["loss_pos_sum"] / s["loss_neg_sum"] == pytest.approx(s["r_loss"])   # the sums a window adds up
    # R < 0.75 and A > 0: group 1 samples 1 and 2 -> 2 of 8.
    assert s["failed_positive_fraction"] == pytest.approx(0.25)
    # one group of two has its mean below the threshold.
    assert s["corpo_phase_fraction"] == pytest.approx(0.5)
    # mean reward (3.5 + 1.5) / 8; successes (R >= 0.75): the three 1.0 in group 0 -> 3 / 8
    assert s["reward_mean"] == pytest.approx(5 / 8)
    assert s["success_rate"] == pytest.approx(3 / 8)


def test_every_metric_is_a_plain_number():
    s = learning_signal(REWARDS, ADV, LOSS, R_MIN)
    assert all(type(v) in (int, float) for v in s.values())


def test_r_count_and_r_loss_are_inf_with_positives_and_no_negatives():
    adv = torch.tensor([[1.0, 0.0, 0.5, 0.0]])
    s = learning_signal(torch.tensor([[1.0, 0.5, 1.0, 0.5]]), adv, torch.tensor([[-1.0, 0.0, -1.0, 0.0]]), R_MIN)
    assert s["r_count"] == math.inf
    assert s["r_loss"] == math.inf


def test_r_count_and_r_loss_are_nan_for_zero_over_zero():
    zeros = torch.zeros(2, 4)
    s = learning_signal(torch.full((2, 4), 0.5), zeros, zeros, R_MIN)
    assert math.isnan(s["r_count"])
    assert math.isnan(s["r_loss"])
    assert s["adv_zero"] == 8


def test_r_count_is_zero_with_negatives_and_no_positives():
    adv = torch.tensor([[-1.0, -0.5]])
    s = learning_signal(torch.tensor([[0.0, 0.25]]), adv, torch.tensor([[1.0, 1.0]]), R_MIN)
    assert s["r_count"] == 0.0
    assert s["r_loss"] == 0.0
    assert s["failed_positive_fraction"] == 0.0
    assert s["corpo_phase_fraction"] == 1.0


def test_census_on_a_hand_made_batch():
    # Two groups, threshold 0.75. Group 1 mean 0.25: GRPO lifts the 0.5 failure above its mean.
    r = torch.tensor([[0.0, 0.0, 0.5, 0.5], [1.0, 0.75, 1.0, 0.75]])
    from streamrl.algo import advantages

    grpo = learning_signal_module.census(r, advantages.compute(r, "grpo", 0.75), 0.75)
    assert grpo == {"census_failed_pos": 2 / 8, "census_failed_nonpos": 2 / 8,
                    "census_passed_pos": 2 / 8, "census_passed_nonpos": 2 / 8}
    corpo = learning_signal_module.census(r, advantages.compute(r, "corpo", 0.75), 0.75)
    assert corpo == {"census_failed_pos": 0.0, "census_failed_nonpos": 4 / 8,
                     "census_passed_pos": 2 / 8, "census_passed_nonpos": 2 / 8}


def test_weight_stats_over_all_parameters():
    stats = learning_signal_module.weight_stats([torch.tensor([[1.0, -2.0]]), torch.tensor([3.0, -4.0, 5.0])])
    assert stats["weights_l1"] == 15.0 and stats["weights_l2"] == pytest.approx(55 ** 0.5)
    assert (stats["weights_min"], stats["weights_max"], stats["weights_mean"]) == (-4.0, 5.0, 0.6)
    assert stats["weights_median"] == 1.0


@pytest.mark.parametrize("estimator, expected", [
    # groups: [1, 1] (zero variance, passed), [0, 0] (zero variance, failed), [1, 0]; r_min 0.5
    ("grpo", {"failed_pos": 0, "failed_nonpos": 3, "passed_pos": 1, "passed_nonpos": 2}),
    ("static", {"failed_pos": 0, "failed_nonpos": 3, "passed_pos": 3, "passed_nonpos": 0}),
    ("corpo", {"failed_pos": 0, "failed_nonpos": 3, "passed_pos": 1, "passed_nonpos": 2}),
])
def test_census_counts_follow_the_estimator_for_groups_never_sent(estimator, expected):
    from streamrl.algo.learning_signal import census_counts

    assert census_counts([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]], estimator, 0.5) == expected
    assert census_counts([], estimator, 0.5) == dict.fromkeys(expected, 0)


def test_weight_stats_streamed_in_small_chunks_match_a_float64_copy_of_everything():
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(37, 11, generator=g), torch.randn(1000, generator=g) * 1e-3, torch.ones(64),
              torch.zeros(5, 3), torch.randn(250, generator=g).to(torch.bfloat16)]
    flat = torch.cat([p.reshape(-1).double() for p in params])
    stats = learning_signal_module.weight_stats(lambda: iter(params), chunk=7)  # many chunks per tensor
    assert stats["weights_median"] == float(flat.median())  # exactly the lower median
    assert stats["weights_l1"] == pytest.approx(float(flat.abs().sum()), rel=1e-12)
    assert stats["weights_l2"] == pytest.approx(float(flat.norm()), rel=1e-12)
    assert stats["weights_mean"] == pytest.approx(float(flat.mean()), rel=1e-9)
    assert (stats["weights_min"], stats["weights_max"]) == (float(flat.min()), float(flat.max()))


@pytest.mark.parametrize("values", [[0.5] * 9, [2.0, 1.0], [3.0, -1.0, 3.0, 3.0], list(range(1000, 0, -1))])
def test_weight_stats_median_is_the_lower_middle_element(values):
    t = torch.tensor(values, dtype=torch.float32)
    assert learning_signal_module.weight_stats([t])["weights_median"] == float(t.median())


def test_weight_stats_over_shards_combine_to_the_stats_of_the_whole():
    """Two shards stepped in lockstep, as ZeRO-3 ranks each holding half of every parameter would."""
    import threading

    g = torch.Generator().manual_seed(1)
    whole = [torch.randn(301, generator=g), torch.randn(20, 5, generator=g)]
    shards = [[p.reshape(-1)[:p.numel() // 2] for p in whole], [p.reshape(-1)[p.numel() // 2:] for p in whole]]
    barrier, pending, results = threading.Barrier(2), [None, None], [None, None]
    ops = {"sum": lambda a, b: a + b, "min": torch.minimum, "max": torch.maximum}

    def reducer(rank):
        def reduce(t, op):
            pending[rank] = t
            barrier.wait()
            out = ops[op](pending[0], pending[1])
            barrier.wait()
            return out
        return reduce

    threads = [threading.Thread(target=lambda r=r: results.__setitem__(
        r, learning_signal_module.weight_stats(shards[r], reducer(r), chunk=64))) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    expected = learning_signal_module.weight_stats(whole)
    assert results[0] == results[1]
    for key, value in expected.items():
        assert results[0][key] == pytest.approx(value, rel=1e-12), key
