"""streamrl.algo.offpolicy: each objective against a hand computation, the on-policy limit of every registered
loss, and the exact counts of the tokens each truncates, masks or clips."""

from __future__ import annotations

import math

import pytest
import torch

from streamrl.algo import losses, offpolicy
from streamrl.learner.stepstats import correction_stats

# Two samples: 3 real tokens + 1 pad, and 2 real tokens + 2 pads -> N = 5 real tokens.
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
BEHAVIOUR = torch.tensor([[-0.5, -1.25, -2.0, 0.0], [-0.75, -3.0, 0.0, 0.0]])
ADV = torch.tensor([0.5, -0.25])
L = math.log


def _run(name: str, ratios, **kw):
    """`name` with logprobs = behaviour + log(ratios) on the real tokens; (output, d loss / d logprobs)."""
    log_ratio = torch.tensor([[L(x) for x in row] + [0.0] * (4 - len(row)) for row in ratios])
    logprobs = (BEHAVIOUR + log_ratio * MASK).requires_grad_(True)
    out = losses.compute(name, logprobs, BEHAVIOUR, ADV, MASK, **kw)
    (grad,) = torch.autograd.grad(out.loss, logprobs)
    return out.filled(MASK), grad


def _close(got, want, atol=1e-6):
    want = torch.as_tensor(want, dtype=got.dtype)
    assert torch.allclose(got, want, rtol=0, atol=atol), f"\n got {got}\nwant {want}"


def _pad(rows):
    return torch.tensor([list(r) + [0.0] * (4 - len(r)) for r in rows])


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
@pytest.mark.parametrize("name", losses.LOSSES.names())
def test_with_behaviour_equal_to_the_current_policy_every_objective_is_the_on_policy_gradient(name, aggregation):
    logprobs = torch.tensor([[-0.3, -1.1, -2.2, 0.0], [-0.9, -2.5, 0.0, 0.0]], requires_grad=True)
    out = losses.compute(name, logprobs, logprobs.detach(), ADV, MASK, aggregation=aggregation).filled(MASK)
    (grad,) = torch.autograd.grad(out.loss, logprobs)
    ref_logprobs = logprobs.detach().clone().requires_grad_(True)
    w = losses.token_weights(MASK, aggregation)
    (want,) = torch.autograd.grad(-(ADV[:, None] * ref_logprobs * w).sum(), ref_logprobs)
    assert torch.equal(grad, want)
    assert torch.equal(out.weights, MASK)  # exactly 1 on every real token
    assert not (out.clipped.any() or out.truncated.any() or out.masked.any())
    assert correction_stats(out, MASK.bool()) == {"truncated_fraction": 0.0, "masked_fraction": 0.0,
                                                  "is_ess_fraction": 1.0}


def test_tis_weighs_the_gradient_by_the_ratio_truncated_at_the_cap():
    out, grad = _run("tis", [[3.0, 0.5, 1.0], [1.5, 2.5]], tis_cap=2.0)
    # weights min(r, 2): [2, .5, 1], [1.5, 2]; d loss / d logp = -A·weight / N with N = 5
    _close(out.weights, _pad([[2.0, 0.5, 1.0], [1.5, 2.0]]))
    _close(grad, _pad([[-0.2, -0.05, -0.1], [0.075, 0.1]]))
    _close(out.loss, -(0.5 * 3.5 - 0.25 * 3.5) / 5)
    assert out.truncated.tolist() == [[True, False, False, False], [False, True, False, False]]
    assert not out.masked.any() and not out.clipped.any()


@pytest.mark.parametrize("name", ["mis", "icepop"])
def test_masked_is_takes_every_token_outside_the_band_out_and_weighs_the_rest_by_their_ratio(name):
    out, grad = _run(name, [[3.0, 0.4, 1.0], [6.0, 1.2]], mis_low=0.5, mis_high=5.0)
    assert out.masked.tolist() == [[False, True, False, False], [True, False, False, False]]
    _close(out.weights, _pad([[3.0, 0.0, 1.0], [0.0, 1.2]]))
    _close(grad, _pad([[-0.3, 0.0, -0.1], [0.0, 0.06]]))
    assert not out.truncated.any()


def test_seq_mask_drops_a_sequence_whose_geometric_mean_ratio_leaves_the_band_and_truncates_the_rest():
    # sample 0: geometric mean 4^(1/3) = 1.59 is inside [0.5, 2] although one token's ratio (4) is not;
    # sample 1: geometric mean 3 is outside, so both its tokens go
    out, grad = _run("seq_mask", [[4.0, 1.0, 1.0], [3.0, 3.0]], seq_mask_low=0.5, seq_mask_high=2.0, tis_cap=2.0)
    assert out.masked.tolist() == [[False] * 4, [True, True, False, False]]
    assert out.truncated.tolist() == [[True, False, False, False], [False] * 4]
    _close(grad, _pad([[-0.2, -0.1, -0.1], [0.0, 0.0]]))


def test_m2po_masks_the_largest_squared_log_ratios_until_their_mean_is_at_most_tau():
    ratios = [[math.exp(0.1), math.exp(-0.1), math.exp(0.5)], [1.0, math.exp(-0.3)]]
    # squared log-ratios .01, .01, .25, 0, .09: mean .072 > .04; without .25 the rest average .0275
    out, grad = _run("m2po", ratios, m2po_tau=0.04)
    assert out.masked.tolist() == [[False, False, True, False], [False] * 4]
    # unclipped ratio·A on the kept tokens: d loss / d logp = -A·r / N
    want = _pad([[-0.5 * math.exp(0.1) / 5, -0.5 * math.exp(-0.1) / 5, 0.0], [0.25 / 5, 0.25 * math.exp(-0.3) / 5]])
    _close(grad, want)
    tighter, _ = _run("m2po", ratios, m2po_tau=0.02)  # .0275 > .02: .09 goes too, leaving .02 / 3
    assert tighter.masked.tolist() == [[False, False, True, False], [False, True, False, False]]
    loose, _ = _run("m2po", ratios, m2po_tau=0.08)  # .072 is within: nothing masked
    assert not loose.masked.any()


def test_second_moment_mask_leaves_the_kept_tokens_within_tau_with_the_fewest_removals():
    g = torch.Generator().manual_seed(0)
    log_ratio = torch.randn(6, 9, generator=g) * 0.4
    mask = (torch.rand(6, 9, generator=g) > 0.2).float()
    for tau in (0.01, 0.04, 0.1):
        drop = offpolicy.second_moment_mask(log_ratio, mask, tau)
        keep = mask.bool() & ~drop
        assert not (drop & ~mask.bool()).any()
        sq = log_ratio[keep] ** 2
        assert float(sq.mean()) <= tau
        # one fewer removal (putting back the smallest dropped) would break the bound
        if drop.any():
            back = (log_ratio[drop] ** 2).min()
            assert float((sq.sum() + back) / (sq.numel() + 1)) > tau


def test_decoupled_ppo_clips_against_the_proximal_policy_and_truncates_the_behaviour_weight():
    prox = BEHAVIOUR + _pad([[L(3.0), L(0.5), 0.0], [0.0, 0.0]])  # behaviour weights 3 -> 2 (cap), .5, 1; 1, 1
    logprobs = (prox + _pad([[0.0, L(1.5), 0.0], [L(0.5), 0.0]])).requires_grad_(True)  # r = 1, 1.5, 1; .5, 1
    out = losses.compute("decoupled_ppo", logprobs, BEHAVIOUR, ADV, MASK, proximal_logprobs=prox, tis_cap=2.0)
    (grad,) = torch.autograd.grad(out.loss, logprobs)
    # A > 0 and r = 1.5 > 1.2: clipped; A < 0 and r = .5 < .8: clipped; the rest -A·weight·r / N
    assert out.clipped.tolist() == [[False, True, False, False], [True, False, False, False]]
    assert out.truncated.tolist() == [[True, False, False, False], [False] * 4]
    _close(grad, _pad([[-0.2, 0.0, -0.1], [0.0, 0.05]]))
    _close(out.weights, _pad([[2.0, 0.5, 1.0], [1.0, 1.0]]))


def test_decoupled_ppo_with_one_optimizer_step_per_batch_has_tis_gradient():
    ratios = [[3.0, 0.5, 1.0], [1.5, 2.5]]
    d, gd = _run("decoupled_ppo", ratios, tis_cap=2.0)
    t, gt = _run("tis", ratios, tis_cap=2.0)
    _close(gd, gt, atol=1e-7)
    assert torch.equal(d.truncated, t.truncated) and not d.clipped.any()


def test_correction_stats_ess_is_the_squared_sum_over_n_times_the_sum_of_squares():
    out, _ = _run("tis", [[3.0, 0.5, 1.0], [1.5, 2.5]], tis_cap=2.0)
    stats = correction_stats(out, MASK.bool())
    # weights 2, .5, 1, 1.5, 2: (Σw)² / (N Σw²) = 49 / (5 · 11.5)
    assert stats["is_ess_fraction"] == pytest.approx(49 / 57.5, abs=1e-12)
    assert stats["truncated_fraction"] == pytest.approx(2 / 5) and stats["masked_fraction"] == 0.0
    every, _ = _run("mis", [[9.0, 9.0, 9.0], [0.1, 0.1]])
    assert correction_stats(every, MASK.bool())["is_ess_fraction"] == 0.0


def test_compute_refuses_a_knob_no_loss_takes():
    with pytest.raises(TypeError, match="no loss takes tis_cpa"):
        losses.compute("tis", BEHAVIOUR, BEHAVIOUR, ADV, MASK, tis_cpa=2.0)
