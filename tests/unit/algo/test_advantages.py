"""streamrl.algo.advantages: each estimator on hand-computed groups, and the invariants of docs/concepts/architecture.md ("The loss")."""

from __future__ import annotations

import math

import pytest
import torch

from streamrl.algo import advantages
from streamrl.algo.advantages import compute


def assert_close(got: torch.Tensor, want: torch.Tensor, rtol: float = 0.0, atol: float = 1e-7) -> None:
    """Cheap stand-in for torch.testing.assert_close (whose first call imports half of torch.distributed)."""
    want = torch.as_tensor(want, dtype=got.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert torch.allclose(got, want, rtol=rtol, atol=atol), f"\n got {got}\nwant {want}"


R_MIN = 0.75

# Group "low": R = [0, 0.25, 0.5, 1], mean = 1.75 / 4 = 0.4375 (below R_MIN = 0.75).
# Group "high": R = [1, 1, 0.75, 0.5], mean = 3.25 / 4 = 0.8125 (at or above R_MIN).
# All numbers are binary fractions, so float32 holds them exactly.
LOW = [0.0, 0.25, 0.5, 1.0]
HIGH = [1.0, 1.0, 0.75, 0.5]


def _rewards(*groups):
    return torch.tensor(groups, dtype=torch.float32)


def test_grpo_subtracts_the_group_mean():
    # low:  R - 0.4375 = [-0.4375, -0.1875, 0.0625, 0.5625]
    # high: R - 0.8125 = [0.1875, 0.1875, -0.0625, -0.3125]
    got = compute(_rewards(LOW, HIGH), "grpo", R_MIN)
    want = torch.tensor([[-0.4375, -0.1875, 0.0625, 0.5625], [0.1875, 0.1875, -0.0625, -0.3125]])
    assert torch.equal(got, want)


def test_static_subtracts_the_threshold():
    # low:  R - 0.75 = [-0.75, -0.5, -0.25, 0.25]
    # high: R - 0.75 = [0.25, 0.25, 0, -0.25]
    got = compute(_rewards(LOW, HIGH), "static", R_MIN)
    want = torch.tensor([[-0.75, -0.5, -0.25, 0.25], [0.25, 0.25, 0.0, -0.25]])
    assert torch.equal(got, want)


def test_corpo_clamps_the_baseline_at_the_threshold():
    # low:  baseline max(0.75, 0.4375) = 0.75   -> [-0.75, -0.5, -0.25, 0.25]
    # high: baseline max(0.75, 0.8125) = 0.8125 -> [0.1875, 0.1875, -0.0625, -0.3125]
    got = compute(_rewards(LOW, HIGH), "corpo", R_MIN)
    want = torch.tensor([[-0.75, -0.5, -0.25, 0.25], [0.1875, 0.1875, -0.0625, -0.3125]])
    assert torch.equal(got, want)


def test_grpo_reinforces_a_failed_sample_where_corpo_does_not():
    # The paper's point: R = 0.5 < R_min sits above the low group's mean 0.4375.
    r = _rewards(LOW)
    assert compute(r, "grpo", R_MIN)[0, 2] > 0
    assert compute(r, "corpo", R_MIN)[0, 2] < 0


def test_grpo_std_normalize_divides_by_the_population_std():
    # [0, 0, 1, 1]: mean 0.5, population std 0.5 -> [-1, -1, 1, 1] (the sample std 0.577 would give ±0.866)
    # [0, 0, 0, 1]: mean 0.25, deviations [-.25, -.25, -.25, .75], variance (3 * .0625 + .5625) / 4 = 0.1875,
    #               std = sqrt(0.1875) = 0.4330127 -> [-1/sqrt(3)] * 3 + [sqrt(3)]
    got = compute(_rewards([0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]), "grpo", R_MIN, std_normalize=True)
    s3 = math.sqrt(3.0)
    want = torch.tensor([[-1.0, -1.0, 1.0, 1.0], [-1 / s3, -1 / s3, -1 / s3, s3]])
    assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_grpo_std_normalize_gives_zero_for_a_zero_variance_group():
    got = compute(_rewards([0.5, 0.5, 0.5, 0.5], [0.0, 0.0, 1.0, 1.0]), "grpo", R_MIN, std_normalize=True)
    assert not torch.isnan(got).any()
    assert torch.equal(got[0], torch.zeros(4))
    assert torch.equal(got[1], torch.tensor([-1.0, -1.0, 1.0, 1.0]))


def test_std_normalize_does_not_touch_static_or_corpo():
    r = _rewards(LOW, HIGH)
    for name in ("static", "corpo"):
        assert torch.equal(compute(r, name, R_MIN, std_normalize=True), compute(r, name, R_MIN))


@pytest.mark.parametrize("name", ["grpo", "static", "corpo"])
@pytest.mark.parametrize("shape", [(1, 2), (3, 4), (7, 16)])
def test_output_shape_equals_input_shape(name, shape):
    r = torch.rand(shape)
    assert compute(r, name, R_MIN).shape == r.shape
    assert compute(r, name, R_MIN, std_normalize=True).shape == r.shape


def _random_groups(seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    ordinal = torch.randint(0, 5, (500, 8)).float() / 4  # levels 0, 1/4, ..., 1 like the symbol tasks
    continuous = torch.rand(500, 8)
    return torch.cat([ordinal, continuous])


@pytest.mark.parametrize("r_min", [0.0, 0.3, 0.5, 0.75, 1.0])
def test_corpo_is_grpo_above_the_threshold_and_static_below(r_min):
    r = _random_groups(1)
    corpo, grpo, static = (compute(r, n, r_min) for n in ("corpo", "grpo", "static"))
    above = r.mean(dim=1) >= r_min
    assert above.any() or r_min == 1.0
    assert (~above).any() or r_min == 0.0
    assert torch.equal(corpo[above], grpo[above])
    assert torch.equal(corpo[~above], static[~above])


@pytest.mark.parametrize("name", ["corpo", "static"])
@pytest.mark.parametrize("r_min", [0.3, 0.5, 0.75, 1.0])
def test_corpo_and_static_never_reward_a_failed_sample(name, r_min):
    for seed in range(5):
        r = _random_groups(seed)
        a = compute(r, name, r_min)
        failed = r < r_min
        assert failed.any()
        assert not (failed & (a > 0)).any()


def test_grpo_does_reward_failed_samples_in_random_groups():
    # The invariant above is not vacuous: the same groups under GRPO do reinforce failures.
    r = _random_groups(0)
    a = compute(r, "grpo", R_MIN)
    assert ((r < R_MIN) & (a > 0)).any()


def test_compute_accepts_integer_rewards_and_returns_float():
    got = compute(torch.tensor([[0, 1]]), "grpo", 0.5)
    assert got.dtype == torch.float32
    assert torch.equal(got, torch.tensor([[-0.5, 0.5]]))


def test_a_bad_estimator_name_raises_key_error_listing_valid_names():
    with pytest.raises(KeyError) as e:
        compute(_rewards(LOW), "ppo", R_MIN)
    msg = str(e.value)
    assert "'ppo'" in msg
    for name in ("corpo", "grpo", "static"):
        assert name in msg


def test_the_registry_holds_exactly_the_three_estimators():
    assert advantages.ESTIMATORS.names() == ["corpo", "grpo", "static"]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_rewards_raise_value_error(bad):
    r = _rewards(LOW, HIGH)
    r[1, 2] = bad
    for name in ("corpo", "grpo", "static"):
        with pytest.raises(ValueError, match="NaN or inf"):
            compute(r, name, R_MIN)


@pytest.mark.parametrize("shape", [(4,), (2, 2, 2), ()])
def test_rewards_that_are_not_2d_raise_value_error(shape):
    with pytest.raises(ValueError, match="num_groups, group_size"):
        compute(torch.zeros(shape), "corpo", R_MIN)
