"""optim.target_drift's arithmetic (streamrl/algo/drift.py) against hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from streamrl.algo import drift


def test_the_drift_per_version_is_the_stale_tokens_k3_over_their_summed_lags():
    ratio = torch.tensor([[2.0, 0.5, 9.0], [1.5, 1.0, 1.0], [3.0, 3.0, 3.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])  # padding never counts
    lags = torch.tensor([1, 2, 0])  # the lag-0 row carries no information
    k3 = lambda r: r - 1 - math.log(r)  # noqa: E731
    sums = drift.drift_sums(ratio, mask, lags)
    assert sums.tolist() == pytest.approx([k3(2.0) + k3(0.5) + k3(1.5), 1 + 1 + 2])
    assert drift.per_version(sums) == pytest.approx((k3(2.0) + k3(0.5) + k3(1.5)) / 4)


def test_a_batch_without_a_stale_token_measures_nothing_and_keeps_the_scale():
    sums = drift.drift_sums(torch.full((2, 3), 1.3), torch.ones(2, 3), torch.zeros(2, dtype=torch.long))
    assert drift.per_version(sums) is None
    assert drift.next_scale(0.3, None, 1e-3) == 0.3


def test_the_scale_moves_by_the_square_root_of_target_over_drift_within_a_factor_of_two_and_never_above_one():
    assert drift.next_scale(0.5, 4e-3, 1e-3) == pytest.approx(0.25)  # KL grows as the square of the step
    assert drift.next_scale(0.5, 2e-3, 1e-3) == pytest.approx(0.5 / 2 ** 0.5)
    assert drift.next_scale(0.5, 1.0, 1e-3) == 0.25  # at most halved in one step
    assert drift.next_scale(0.2, 1e-6, 1e-3) == pytest.approx(0.4)  # at most doubled
    assert drift.next_scale(0.8, 0.0, 1e-3) == 1.0  # and never above the configured lr
    assert drift.next_scale(drift.FLOOR, 1.0, 1e-3) == drift.FLOOR


def test_at_the_target_the_scale_holds():
    assert drift.next_scale(0.37, 1e-3, 1e-3) == pytest.approx(0.37)
