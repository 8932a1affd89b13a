"""Variance control for off-policy objectives: an ESS-scaled step size and the off-policy minimum-variance baseline.

Huang, Zhang, Hu, Yang, Han 2026, "Stable Asynchrony: Variance-Controlled Off-Policy RL for LLMs" (VCPO,
arXiv:2602.17616; code github.com/mit-han-lab/vcpo). Their diagnosis: with stale data the importance weights grow
heavy-tailed, a few samples dominate the update, and collapse is preceded by a falling effective sample size (ESS)
of the weights. Their two controls, as the paper's README states them and their code implements them
(verl/workers/actor/megatron_actor.py `_optimizer_step_with_buffer`; recipe/fully_async_policy/staleness_utils.py
`compute_ess_info`, `compute_opob_baseline`; the section and equation numbers of the paper's text were not
available to us):

1. ESS-guided step scaling: ρ = ESS / N = (Σw)² / (N Σw²) of the batch's importance weights, and the learning
   rate of that optimizer step multiplied by sqrt(min(1, ρ)) ("sqrt scaling for AdamW-style optimizers"; the code
   offers "linear" too). Adam is invariant to the scale of the loss, so the scale goes on the lr (`step_scale`).
2. The off-policy optimal baseline (OPOB), per group: b* = Σ w_i² ‖∇log π(τ_i)‖² R_i / Σ w_i² ‖∇log π(τ_i)‖²,
   the b minimising E‖Σ_i w_i (R_i - b) ∇log π(τ_i)‖² when the samples' terms are uncorrelated (set the derivative
   Σ_i -2 w_i² ‖g_i‖² (R_i - b) to 0). `baseline_shift` below.

What differs here, and why. The objectives (streamrl.algo.offpolicy) weight tokens, not sequences, so the weights w
are the per-token `LossOutput.weights` the objective applies (VCPO's are the sequence ratios Π_t π/μ). VCPO measures
‖∇log π(τ_i)‖² with a backward pass per sample; here it is replaced by the proxy Σ_t c_it² w_it² (c the token weights
of `loss.aggregation`): the squared norm of sample i's weighted gradient Σ_t c_it w_it ∇log π_t when its tokens'
score vectors are uncorrelated and of equal norm. It needs no extra backward, and with one weight per sequence
and equal lengths it is VCPO's w_i²‖g_i‖² (up to a constant that cancels) where the samples' gradient norms
agree. Last, the estimator (CoRPO, GRPO) owns the on-policy baseline, so the advantages are shifted by
b*(w) - b*(1): exactly 0 when every weight is 1 (strict mode, the on-policy limit), VCPO's b* itself on GRPO's
advantages when lengths are equal.
"""

from __future__ import annotations

import torch

VARIANCE_CONTROLS = ("none", "ess_step", "mvb", "both")
STEP_RULES = ("sqrt", "linear")


def ess_sums(weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(3,) float64 [Σw, Σw², N] of the importance weights (B, T) over the tokens mask (B, T) marks: what ranks add
    up before `ess_fraction_of`."""
    m = mask.bool()
    w = weights[m].double()
    return torch.stack([w.sum(), (w * w).sum(), torch.tensor(float(w.numel()), dtype=torch.float64)])


def ess_fraction_of(sums: torch.Tensor) -> float:
    """ESS / N = (Σw)² / (N Σw²) from `ess_sums`: 1 when every weight is equal (exactly, for weights of exactly 1),
    1/N when one token carries them all, 0 when every weight is 0."""
    total, sq, n = (float(x) for x in sums)
    return total * total / (n * sq) if sq > 0 else 0.0


def ess_fraction(weights: torch.Tensor, mask: torch.Tensor) -> float:
    """ESS / N of the importance weights (B, T) over the tokens mask (B, T) marks."""
    return ess_fraction_of(ess_sums(weights, mask))


def step_scale(ess: float, rule: str = "sqrt", floor: float = 0.0) -> float:
    """The lr multiplier for a batch of ESS fraction `ess`: sqrt(ess) (VCPO's rule for AdamW) or ess ("linear"),
    never above 1 nor below `floor`; exactly 1.0 when ess is 1.0."""
    if rule not in STEP_RULES:
        raise ValueError(f"rule={rule!r}: allowed {', '.join(STEP_RULES)}")
    ess = min(1.0, max(0.0, ess))
    return max(floor, ess ** 0.5 if rule == "sqrt" else ess)


def _optimal_baseline(norms: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """(groups,) Σ_i n_i A_i / Σ_i n_i per group; norms, advantages: (groups, G); 0 for a group whose norms are 0."""
    total = norms.sum(-1)
    return torch.where(total > 0, (norms * advantages).sum(-1) / total.clamp_min(1e-300), torch.zeros_like(total))


def baseline_shift(weights: torch.Tensor, token_weights: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """(groups,) b*(w) - b*(1): how far the importance weights move each group's variance-minimising baseline.

    weights: (B, T) the objective's importance weights (0 on padding and where masked); token_weights: (B, T) the
    loss's token weights c (losses.token_weights; 0 on padding); advantages: (groups, G), B = groups × G.
    b*(w) = Σ_i v_i A_i / Σ_i v_i with v_i = Σ_t c_it² w_it² (see the module docstring); b*(1) takes w = 1 on every
    token c covers. Exactly 0 for a group whose weights are all exactly 1."""
    groups, G = advantages.shape
    c2 = token_weights.double() ** 2
    on = (token_weights > 0).double()
    adv = advantages.double()
    off = _optimal_baseline((c2 * weights.double() ** 2).sum(-1).view(groups, G), adv)
    return off - _optimal_baseline((c2 * on ** 2).sum(-1).view(groups, G), adv)
