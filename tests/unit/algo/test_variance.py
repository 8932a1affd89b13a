"""streamrl.algo.variance (VCPO): the ESS step scale and the off-policy minimum-variance baseline against hand
computations, their exact on-policy limit around every registered objective, and A-3PO's interpolated proximal
policy in decoupled_ppo."""

from __future__ import annotations

import math

import pytest
import torch

from streamrl.algo import losses, variance

# Two samples: 3 real tokens + 1 pad, and 2 real tokens + 2 pads -> N = 5 real tokens (test_offpolicy's batch).
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
ADV = torch.tensor([0.5, -0.25])


def test_ess_fraction_and_step_scale_by_hand():
    w = torch.tensor([[2.0, 0.5, 1.0, 9.0], [1.5, 2.0, 9.0, 9.0]])  # the 9s sit on padding: not counted
    # Σw = 7, Σw² = 4 + .25 + 1 + 2.25 + 4 = 11.5, N = 5: ESS/N = 49 / 57.5
    assert variance.ess_fraction(w, MASK) == pytest.approx(49 / 57.5, abs=1e-15)
    assert variance.step_scale(49 / 57.5) == pytest.approx(math.sqrt(49 / 57.5), abs=1e-15)
    assert variance.step_scale(49 / 57.5, "linear") == pytest.approx(49 / 57.5, abs=1e-15)
    assert variance.step_scale(0.04, "sqrt", floor=0.5) == 0.5  # sqrt(.04) = .2, floored
    assert variance.step_scale(0.0) == 0.0  # every weight 0 (all masked): no step
    with pytest.raises(ValueError, match="rule='cube': allowed sqrt, linear"):
        variance.step_scale(0.5, "cube")


@pytest.mark.parametrize("n", [1, 5, 12_345])
def test_weights_of_exactly_one_give_a_step_scale_of_exactly_one(n):
    ones = torch.ones(1, n)
    assert variance.ess_fraction(ones, ones) == 1.0
    assert variance.step_scale(1.0) == 1.0 and variance.step_scale(1.0, "linear") == 1.0


def test_baseline_shift_by_hand():
    # 2 groups of G = 2, rows of 2 tokens; row 2 has one real token. Token aggregation: c = 1/N on every token, so
    # v_i = Σ_t w_it² up to c², which cancels within a group.
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    w = torch.tensor([[2.0, 1.0], [1.0, 1.0], [0.5, 0.0], [1.0, 3.0]])
    adv = torch.tensor([[1.0, -1.0], [0.5, -0.5]])
    c = losses.token_weights(mask, "token")
    got = variance.baseline_shift(w, c, adv)
    # group 0: v(w) = (5, 2): b*(w) = (5 - 2) / 7; v(1) = (2, 2): b*(1) = 0
    # group 1: v(w) = (.25, 10): b*(w) = (.125 - 5) / 10.25; v(1) = (1, 2): b*(1) = (.5 - 1) / 3
    want = torch.tensor([3 / 7, -4.875 / 10.25 + 0.5 / 3], dtype=torch.float64)
    assert torch.allclose(got, want, rtol=0, atol=1e-12), got
    # sequence aggregation: c_it = 1 / (|o_i| S), so row 2 (one token) weighs 4x row 3 (two tokens) per token²:
    # group 1: v(w) = (.25, 10/4): b*(w) = (.125 - 1.25) / 2.75; v(1) = (1, 2/4): b*(1) = (.5 - .25) / 1.5
    got = variance.baseline_shift(w, losses.token_weights(mask, "sequence"), adv)
    assert got[1].item() == pytest.approx(-1.125 / 2.75 - 0.25 / 1.5, abs=1e-12)


def test_baseline_shift_is_exactly_zero_when_every_weight_is_one():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([[0.3, -0.7], [1.1, 0.2]])
    for aggregation in losses.AGGREGATIONS:
        shift = variance.baseline_shift(mask.clone(), losses.token_weights(mask, aggregation), adv)
        assert torch.equal(shift, torch.zeros(2, dtype=torch.float64))


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
@pytest.mark.parametrize("name", losses.LOSSES.names())
def test_with_behaviour_equal_to_the_current_policy_both_controls_reduce_to_the_on_policy_gradient(name, aggregation):
    """Around every objective: weights exactly 1, so the step scale is exactly 1 and the baseline shift exactly 0,
    and the objective's gradient on the shifted advantages is the on-policy gradient bit for bit."""
    logprobs = torch.tensor([[-0.3, -1.1, -2.2, 0.0], [-0.9, -2.5, 0.0, 0.0]], requires_grad=True)
    adv = ADV.view(1, 2)  # one group of two
    first = losses.compute(name, logprobs, logprobs.detach(), adv.flatten(), MASK, aggregation=aggregation)
    weights = first.filled(MASK).weights
    assert variance.step_scale(variance.ess_fraction(weights, MASK)) == 1.0
    shift = variance.baseline_shift(weights, losses.token_weights(MASK, aggregation), adv)
    assert torch.equal(shift, torch.zeros(1, dtype=torch.float64))
    shifted = (adv - shift[:, None].float()).flatten()
    out = losses.compute(name, logprobs, logprobs.detach(), shifted, MASK, aggregation=aggregation)
    (grad,) = torch.autograd.grad(out.loss, logprobs)
    ref = logprobs.detach().clone().requires_grad_(True)
    (want,) = torch.autograd.grad(-(ADV[:, None] * ref * losses.token_weights(MASK, aggregation)).sum(), ref)
    assert torch.equal(grad, want)


def test_the_baseline_uses_the_weights_the_wrapped_objective_applies():
    # One group of two; the first sample's ratios (3, .4, 1) under mis (band [.5, 5]) weigh (3, 0, 1): its masked
    # token carries nothing, where tis (cap 2) weighs it (2, .4, 1)
    behaviour = torch.tensor([[-0.5, -1.25, -2.0, 0.0], [-0.75, -3.0, 0.0, 0.0]])
    logprobs = behaviour + torch.log(torch.tensor([[3.0, 0.4, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])) * MASK
    adv = ADV.view(1, 2)
    c = losses.token_weights(MASK, "token")
    shifts = {}
    for name in ("mis", "tis"):
        w = losses.compute(name, logprobs, behaviour, ADV, MASK).filled(MASK).weights
        shifts[name] = float(variance.baseline_shift(w, c, adv)[0])
    # v(w): mis (9 + 0 + 1, 2) = (10, 2), tis (4 + .16 + 1, 2) = (5.16, 2); v(1) = (3, 2): b*(1) = (1.5 - .5) / 5
    assert shifts["mis"] == pytest.approx((5 - 0.5) / 12 - 0.2, abs=1e-6)
    assert shifts["tis"] == pytest.approx((2.58 - 0.5) / 7.16 - 0.2, abs=1e-6)


def _dppo(logprobs, behaviour, **kw):
    lp = logprobs.clone().requires_grad_(True)
    out = losses.compute("decoupled_ppo", lp, behaviour, ADV, MASK, **kw)
    (grad,) = torch.autograd.grad(out.loss, lp)
    return out.filled(MASK), grad


def test_decoupled_ppo_with_an_interpolated_proximal_by_hand():
    # log π_θ - log π_behaviour = 2 ln 1.5 on every token; α = 1/2 puts the proximal halfway: the behaviour weight
    # π_prox / π_behaviour and the ratio π_θ / π_prox are both 1.5. Clip 0.2: for A > 0 (sample 0) min(1.5 A, 1.2 A)
    # is clipped (no gradient); for A < 0 (sample 1) 1.5 A is kept, so d loss / d logp = -1.5 · 1.5 · A / N.
    behaviour = torch.tensor([[-0.5, -1.25, -2.0, 0.0], [-0.75, -3.0, 0.0, 0.0]])
    logprobs = behaviour + 2 * math.log(1.5) * MASK
    out, grad = _dppo(logprobs, behaviour, proximal_alpha=torch.tensor([0.5, 0.5]))
    assert torch.allclose(out.weights, 1.5 * MASK, atol=1e-6)
    assert out.clipped.tolist() == [[True, True, True, False], [False, False, False, False]]
    want = torch.tensor([[0.0] * 4, [2.25 * 0.25 / 5] * 2 + [0.0, 0.0]])
    assert torch.allclose(grad, want, atol=1e-7), grad


def test_interpolation_weights_of_one_and_zero_are_the_current_and_the_behaviour_policy_exactly():
    behaviour = torch.tensor([[-0.5, -1.25, -2.0, 0.0], [-0.75, -3.0, 0.0, 0.0]])
    logprobs = behaviour + torch.tensor([[0.3, -0.2, 0.5, 0.0], [0.1, 0.4, 0.0, 0.0]])
    for alpha, proximal in ((1.0, logprobs), (0.0, behaviour)):
        got = _dppo(logprobs, behaviour, proximal_alpha=torch.full((2,), alpha))
        want = _dppo(logprobs, behaviour, proximal_logprobs=proximal)
        assert torch.equal(got[0].loss, want[0].loss) and torch.equal(got[1], want[1]), alpha


def test_a3po_interpolation_weights_by_hand():
    from streamrl.comm.codec import ScoredGroup
    from streamrl.learner.batch import collate
    from streamrl.learner.minibatches import interpolation

    groups = [ScoredGroup.from_samples(prompt_id=f"p{v}", policy_version=v, actor_id="a", prompt_tokens=[1],
                                       completions=[[2], [3]], logprobs=[[-1.0], [-1.0]], rewards=[0.0, 1.0],
                                       finish_reasons=["stop"] * 2) for v in (3, 5)]
    batch = collate(groups, pad_id=0)
    # consumed at version 5 with k = 2 minibatches: group 0 is 2 versions = 4 steps behind the proximal, group 1 none
    assert interpolation(batch, 0, 2, 5).tolist() == [1.0] * 4  # the first minibatch trains on the proximal weights
    assert interpolation(batch, 1, 2, 5).tolist() == [0.8, 0.8, 0.0, 0.0]  # 4 / (4 + 1); lag 0: the behaviour's
    with pytest.raises(ValueError, match="loss.proximal=interpolate: the batch's learner version is needed"):
        interpolation(batch, 1, 2, None)
