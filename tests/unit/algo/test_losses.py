"""streamrl.algo.losses.token_pg: ratio, PPO clip, truncated IS for A < 0, token-level normalisation."""

from __future__ import annotations

import math

import pytest
import torch

from streamrl.algo import losses
from streamrl.algo.losses import token_pg


def assert_close(got: torch.Tensor, want: torch.Tensor, rtol: float = 0.0, atol: float = 1e-7) -> None:
    """Cheap stand-in for torch.testing.assert_close (whose first call imports half of torch.distributed)."""
    want = torch.as_tensor(want, dtype=got.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert torch.allclose(got, want, rtol=rtol, atol=atol), f"\n got {got}\nwant {want}"


# Two samples: 3 real tokens + 1 pad, and 2 real tokens + 2 pads -> 5 real tokens.
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
N_TOKENS = 5.0


def _behaviour() -> torch.Tensor:
    return torch.tensor([[-0.5, -1.25, -2.0, -0.1], [-0.75, -3.0, -0.2, -0.3]])


def _run(log_ratio, adv, mask=MASK, **kw):
    """token_pg with logprobs = behaviour + log_ratio; returns (output, d loss / d logprobs)."""
    behaviour = _behaviour()[: mask.shape[0], : mask.shape[1]]
    logprobs = (behaviour + torch.as_tensor(log_ratio, dtype=torch.float32)).requires_grad_(True)
    out = token_pg(logprobs, behaviour, torch.tensor(adv, dtype=torch.float32), mask, **kw)
    (grad,) = torch.autograd.grad(out.loss, logprobs)
    return out, grad


def test_on_policy_ratio_is_exactly_one_and_nothing_is_clipped():
    out, _ = _run(0.0, [0.5, -0.25])
    assert torch.equal(out.ratio, torch.ones_like(out.ratio))
    assert not out.clipped.any()


def test_on_policy_gradient_is_minus_advantage_over_token_count_and_zero_on_padding():
    adv = [0.5, -0.25]
    out, grad = _run(0.0, adv)
    assert MASK.sum() == N_TOKENS
    # d loss / d logprob = -A / 5 on real tokens: -0.1 for sample 0, +0.05 for sample 1; 0 on pads.
    want = torch.tensor([[-0.1, -0.1, -0.1, 0.0], [0.05, 0.05, 0.0, 0.0]])
    assert_close(grad, want, rtol=0, atol=1e-7)
    assert torch.equal(grad[MASK == 0], torch.zeros(3))


def test_on_policy_loss_weighs_every_token_equally():
    # loss = -(sum over real tokens of A) / N = -(3 * 0.5 + 2 * -0.25) / 5 = -(1.5 - 0.5) / 5 = -0.2
    out, _ = _run(0.0, [0.5, -0.25])
    assert_close(out.loss, torch.tensor(-0.2), rtol=0, atol=1e-7)
    assert_close(out.token_loss.sum(), out.loss.detach(), rtol=0, atol=1e-7)
    assert torch.equal(out.token_loss[MASK == 0], torch.zeros(3))


def test_padding_log_probs_do_not_change_the_loss():
    wild = torch.zeros(2, 4)
    wild[MASK == 0] = 7.0  # far off-policy, but on padding
    a, ga = _run(0.0, [0.5, -0.25])
    b, gb = _run(wild, [0.5, -0.25])
    assert torch.equal(a.loss, b.loss)
    assert torch.equal(ga, gb)


def test_ppo_clip_removes_the_gradient_for_positive_advantage_above_one_plus_clip_high():
    mask = torch.ones(1, 2)
    # ratio 1.5 > 1 + 0.2: objective is the constant 1.2 * A -> loss = -1.2 * 0.5 / 2 per token, sum -0.3
    out, grad = _run(math.log(1.5), [0.5], mask=mask[:, :2], clip_high=0.2)
    assert torch.equal(grad, torch.zeros(1, 2))
    assert out.clipped.all()
    assert_close(out.loss, torch.tensor(-0.6), rtol=1e-6, atol=1e-7)


def test_clip_high_is_its_own_knob():
    mask = torch.ones(1, 2)
    # same ratio 1.5 with clip_high 0.6: inside the range, gradient -A * ratio / n = -0.5 * 1.5 / 2
    out, grad = _run(math.log(1.5), [0.5], mask=mask, clip_high=0.6)
    assert not out.clipped.any()
    assert_close(grad, torch.full((1, 2), -0.375), rtol=1e-6, atol=1e-7)


def test_positive_advantage_inside_the_clip_range_keeps_its_gradient():
    mask = torch.ones(1, 2)
    # ratio 1.1: d(-ratio * A / n)/d logprob = -ratio * A / n = -1.1 * 0.5 / 2 = -0.275
    out, grad = _run(math.log(1.1), [0.5], mask=mask)
    assert not out.clipped.any()
    assert_close(grad, torch.full((1, 2), -0.275), rtol=1e-6, atol=1e-7)


def test_negative_advantage_below_one_minus_clip_low_is_clipped():
    mask = torch.ones(1, 2)
    # ratio 0.5 < 0.8, A = -1: min(0.5 * -1, 0.8 * -1) = -0.8, constant -> loss 0.8 * 2 / 2 = 0.8
    out, grad = _run(math.log(0.5), [-1.0], mask=mask)
    assert torch.equal(grad, torch.zeros(1, 2))
    assert out.clipped.all()
    assert_close(out.loss, torch.tensor(0.8), rtol=1e-6, atol=1e-7)


def test_negative_advantage_between_clip_and_cap_keeps_its_gradient():
    mask = torch.ones(1, 2)
    # ratio 1.5 (above 1.2, below is_cap 2), A = -1: objective -1.5, gradient flows: -ratio * A / n = 0.75
    out, grad = _run(math.log(1.5), [-1.0], mask=mask, is_cap=2.0)
    assert not out.clipped.any()
    assert_close(grad, torch.full((1, 2), 0.75), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("log_ratio", [math.log(20.0), 1000.0])
def test_negative_advantage_ratio_is_truncated_at_is_cap(log_ratio):
    mask = torch.ones(1, 2)
    # huge ratio, A = -0.5, is_cap = 3: objective floored at 3 * -0.5 -> per-token loss 1.5 / 2, sum 1.5
    out, grad = _run(log_ratio, [-0.5], mask=mask, is_cap=3.0)
    assert_close(out.loss, torch.tensor(1.5), rtol=1e-6, atol=1e-7)
    assert_close(out.token_loss, torch.full((1, 2), 0.75), rtol=1e-6, atol=1e-7)
    assert torch.equal(grad, torch.zeros(1, 2))
    assert out.clipped.all()


@pytest.mark.parametrize("log_ratio", [1000.0, -1000.0])
@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_extreme_log_ratios_give_no_inf_or_nan(log_ratio, adv):
    out, grad = _run(log_ratio, [adv, adv])
    for t in (out.loss, out.token_loss, out.ratio, grad):
        assert torch.isfinite(t).all()


def test_kl_and_entropy_with_zero_coefficients_equal_omitting_them():
    behaviour = _behaviour()
    logprobs = behaviour + 0.1
    adv = torch.tensor([0.5, -0.25])
    ref = behaviour - 0.7
    ent = torch.rand(2, 4)
    base = token_pg(logprobs, behaviour, adv, MASK)
    zero = token_pg(logprobs, behaviour, adv, MASK, kl_coef=0.0, entropy_coef=0.0, ref_logprobs=ref, entropy=ent)
    assert torch.equal(base.loss, zero.loss)


def test_kl_against_an_identical_reference_adds_zero_loss_and_zero_gradient():
    behaviour = _behaviour()
    adv = torch.tensor([0.5, -0.25])
    lp1 = (behaviour + 0.1).requires_grad_(True)
    lp2 = (behaviour + 0.1).requires_grad_(True)
    base = token_pg(lp1, behaviour, adv, MASK)
    kl = token_pg(lp2, behaviour, adv, MASK, kl_coef=0.5, ref_logprobs=lp2.detach().clone())
    assert torch.equal(base.loss, kl.loss)
    (g1,) = torch.autograd.grad(base.loss, lp1)
    (g2,) = torch.autograd.grad(kl.loss, lp2)
    assert_close(g1, g2, rtol=0, atol=1e-8)


def test_kl_penalty_is_the_k3_estimator_per_token():
    # one real token, on-policy, A = 0 -> PG part 0. ref - logp = ln 2: k3 = e^ln2 - ln2 - 1 = 1 - ln 2
    logprobs = torch.tensor([[-1.0, -1.0]])
    ref = logprobs + math.log(2.0)
    mask = torch.tensor([[1.0, 0.0]])
    out = token_pg(logprobs, logprobs, torch.tensor([0.0]), mask, kl_coef=0.5, ref_logprobs=ref)
    assert_close(out.loss, torch.tensor(0.5 * (1 - math.log(2.0))), rtol=1e-6, atol=1e-7)


def test_entropy_bonus_subtracts_the_token_mean_entropy():
    # entropy on real tokens 1 and 3 (pad ignored): mean 2, coefficient 0.1 -> loss -0.2 (PG part 0)
    logprobs = torch.tensor([[-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    ent = torch.tensor([[1.0, 3.0, 100.0]])
    out = token_pg(logprobs, logprobs, torch.tensor([0.0]), mask, entropy_coef=0.1, entropy=ent)
    assert_close(out.loss, torch.tensor(-0.2), rtol=1e-6, atol=1e-7)


def test_an_all_padding_batch_gives_zero_loss_not_nan():
    out, grad = _run(0.0, [1.0, -1.0], mask=torch.zeros(2, 4))
    assert out.loss.item() == 0.0
    assert torch.equal(grad, torch.zeros(2, 4))


def test_compute_dispatches_by_name_and_lists_valid_names_on_a_bad_one():
    behaviour = _behaviour()
    adv = torch.tensor([0.5, -0.25])
    a = losses.compute("token_pg", behaviour + 0.05, behaviour, adv, MASK, clip_high=0.1)
    b = token_pg(behaviour + 0.05, behaviour, adv, MASK, clip_high=0.1)
    assert torch.equal(a.loss, b.loss)
    with pytest.raises(KeyError, match="valid: decoupled_ppo, icepop, m2po, mis, seq_mask, tis, token_pg"):
        losses.compute("nope", behaviour, behaviour, adv, MASK)


def test_sequence_aggregation_averages_each_sequence_then_the_sequences():
    # on-policy, ratio 1: per-token objective A. Sample 0: 3 tokens of 0.5 -> mean 0.5; sample 1: 2 tokens
    # of -0.25 -> mean -0.25. loss = -(0.5 - 0.25) / 2 = -0.125 (the token mean would be -0.2).
    out, grad = _run(0.0, [0.5, -0.25], aggregation="sequence")
    assert_close(out.loss, torch.tensor(-0.125), rtol=0, atol=1e-7)
    # d loss / d logprob = -A / (|o_i| · 2): -0.5/6 on sample 0's tokens, 0.25/4 on sample 1's, 0 on pads.
    want = torch.tensor([[-0.5 / 6] * 3 + [0.0], [0.0625, 0.0625, 0.0, 0.0]])
    assert_close(grad, want, rtol=0, atol=1e-7)


def test_sequence_aggregation_weighs_a_short_sequence_like_a_long_one():
    w = losses.token_weights(MASK, "sequence")
    assert_close(w.sum(-1), torch.tensor([0.5, 0.5]), rtol=0, atol=1e-7)
    assert_close(losses.token_weights(MASK, "token").sum(-1), torch.tensor([0.6, 0.4]), rtol=0, atol=1e-7)


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_micro_batches_with_the_whole_batch_counts_add_up_to_the_whole_batch_loss_and_gradient(aggregation):
    # 5 samples of 1..4 real tokens, split 2 + 1 + 2 as the learner's micro-batches split rows
    g = torch.Generator().manual_seed(3)
    lengths = [3, 1, 4, 2, 4]
    mask = (torch.arange(4)[None, :] < torch.tensor(lengths)[:, None]).float()
    behaviour = -torch.rand(5, 4, generator=g)
    logprobs = (behaviour + 0.3 * torch.randn(5, 4, generator=g)).requires_grad_(True)
    adv = torch.randn(5, generator=g)
    ref, ent = behaviour - 0.2, torch.rand(5, 4, generator=g)
    kw = dict(aggregation=aggregation, kl_coef=0.1, entropy_coef=0.01)
    whole = token_pg(logprobs, behaviour, adv, mask, ref_logprobs=ref, entropy=ent, **kw)
    (g_whole,) = torch.autograd.grad(whole.loss, logprobs)
    parts = [slice(0, 2), slice(2, 3), slice(3, 5)]
    counts = dict(token_count=float(mask.sum()), sequence_count=5.0)
    outs = [token_pg(logprobs[r], behaviour[r], adv[r], mask[r], ref_logprobs=ref[r], entropy=ent[r], **kw, **counts)
            for r in parts]
    (g_parts,) = torch.autograd.grad(sum(o.loss for o in outs), logprobs)
    assert_close(sum(o.loss for o in outs).detach(), whole.loss.detach(), rtol=0, atol=1e-6)
    assert_close(g_parts, g_whole, rtol=0, atol=1e-7)
    assert_close(torch.cat([o.token_loss for o in outs]), whole.token_loss, rtol=0, atol=1e-7)
    # without the whole batch's counts each part would be its own mean: not the same loss
    alone = sum(token_pg(logprobs[r], behaviour[r], adv[r], mask[r], ref_logprobs=ref[r], entropy=ent[r], **kw).loss
                for r in parts)
    assert abs(float(alone.detach()) - float(whole.loss.detach())) > 1e-3


def test_an_unknown_aggregation_is_refused_with_the_allowed_ones():
    with pytest.raises(ValueError, match="allowed token, sequence"):
        losses.token_weights(MASK, "group")
