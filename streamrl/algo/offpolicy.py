"""Off-policy objectives: the policy-gradient losses that correct for stale or mismatched behaviour policies.

Each is a small pure function in the loss registry (declared with its options in `streamrl.algo.loss_specs`), with
token_pg's tensors and conventions (all (B, T), `mask` 1 on the completion tokens the model sampled,
`advantages` (B,), token losses weighted by `losses.token_weights`). Each returns the per-token bool tensors
`clipped` (a trust region removed the gradient), `truncated` (an importance weight was capped: gradient kept,
scaled down) and `masked` (an importance-sampling mask removed the gradient), and the importance `weights`
each token's gradient carries (0 where masked), from which the learner counts and reports them.

With behaviour = the current policy (behaviour_logprobs == logprobs.detach(), as the learner passes in
strict on-policy mode) every weight is exactly 1, nothing is clipped, truncated or masked, and each
objective's gradient is the on-policy policy gradient -A·w·∇log π (tests/unit/algo/test_offpolicy.py).
"""

from __future__ import annotations

import torch

from streamrl.algo.loss_base import LossOutput, importance_ratio, regularised, token_weights


def _setup(logprobs, behaviour_logprobs, advantages, mask, token_count, aggregation, sequence_count):
    """mask as floats (B, T), token weights w (B, T), advantages (B, 1), the detached importance ratio
    pi_theta / pi_behaviour (B, T), and `on` = exp(logprobs - logprobs.detach()) (B, T): 1 in value, whose
    gradient is ∇log π, so `weight · on · A` is the importance-weighted policy gradient."""
    m = mask.to(logprobs.dtype)
    w = token_weights(m, aggregation, token_count, sequence_count).to(logprobs.dtype)
    adv = advantages[:, None].to(logprobs.dtype)
    ratio = importance_ratio(logprobs.detach(), behaviour_logprobs)
    on = torch.exp(logprobs - logprobs.detach())
    return m, w, adv, ratio, on


def _output(pg, logprobs, w, m, ratio, reg, *, clipped=None, truncated=None, masked=None, weights):
    """LossOutput of the per-token surrogate `pg` (B, T) (to maximise), its KL and entropy terms
    `reg` = (kl_coef, ref_logprobs, entropy_coef, entropy)."""
    token_loss = -pg * w
    loss = regularised(token_loss.sum(), logprobs, w, *reg)
    none = torch.zeros_like(m, dtype=torch.bool)
    return LossOutput(loss=loss, token_loss=token_loss.detach(), ratio=ratio,
                      clipped=none if clipped is None else clipped,
                      truncated=none if truncated is None else truncated,
                      masked=none if masked is None else masked, weights=(weights * m).detach())


def tis(logprobs, behaviour_logprobs, advantages, mask, *, tis_cap: float = 2.0, kl_coef: float = 0.0,
        entropy_coef: float = 0.0, ref_logprobs=None, entropy=None, token_count=None, aggregation: str = "token",
        sequence_count=None) -> LossOutput:
    """Token-level truncated importance sampling (TIS): vanilla policy gradient weighted by the detached
    min(pi_theta / pi_behaviour, tis_cap).

    Yao, Liu et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
    (fengyao.notion.site/off-policy-rl; verl's `tis_imp_ratio_cap`, default 2). No PPO clip: the cap alone
    bounds the variance. A token whose ratio exceeds the cap is `truncated`.
    """
    m, w, adv, ratio, on = _setup(logprobs, behaviour_logprobs, advantages, mask, token_count, aggregation,
                                  sequence_count)
    weight = ratio.clamp_max(tis_cap)
    return _output(weight * on * adv, logprobs, w, m, ratio, (kl_coef, ref_logprobs, entropy_coef, entropy),
                   truncated=(ratio > tis_cap) & m.bool(), weights=weight)


def masked_is(logprobs, behaviour_logprobs, advantages, mask, *, mis_low: float = 0.5, mis_high: float = 5.0,
              kl_coef: float = 0.0, entropy_coef: float = 0.0, ref_logprobs=None, entropy=None, token_count=None,
              aggregation: str = "token", sequence_count=None) -> LossOutput:
    """Masked importance sampling (MIS, IcePop): a token whose ratio pi_theta / pi_behaviour leaves
    [mis_low, mis_high] gets no gradient (`masked`); the others the policy gradient weighted by their
    detached ratio.

    IcePop: Ling Team (inclusionAI) 2025, "Every Step Evolves: Scaling Reinforcement Learning for
    Trillion-Scale Thinking Model" (Ring-1T), band [0.5, 5]; MIS in verl's rollout correction
    (`rollout_is: token`, mask mode). Unlike truncation, a masked token cannot pull the update at all.
    """
    m, w, adv, ratio, on = _setup(logprobs, behaviour_logprobs, advantages, mask, token_count, aggregation,
                                  sequence_count)
    keep = (ratio >= mis_low) & (ratio <= mis_high)
    weight = ratio * keep
    return _output(weight * on * adv, logprobs, w, m, ratio, (kl_coef, ref_logprobs, entropy_coef, entropy),
                   masked=~keep & m.bool(), weights=weight)




def seq_mask(logprobs, behaviour_logprobs, advantages, mask, *, seq_mask_low: float = 0.5,
             seq_mask_high: float = 2.0, tis_cap: float = 2.0, kl_coef: float = 0.0, entropy_coef: float = 0.0,
             ref_logprobs=None, entropy=None, token_count=None, aggregation: str = "token",
             sequence_count=None) -> LossOutput:
    """Sequence-level geometric-mean masking, then token TIS: a sequence whose exp(mean over its model
    tokens of log(pi_theta / pi_behaviour)) leaves [seq_mask_low, seq_mask_high] gets no gradient (all its
    tokens `masked`); the others' tokens are weighted by the detached min(ratio, tis_cap) as in `tis`.

    verl's rollout correction (`rollout_rs: geometric` rejection sampling with token IS,
    docs/algo/rollout_corr.md) and OpenRLHF's `seq-mask-tis`; the geometric mean is GSPO's sequence
    ratio (Zheng et al. 2025, "Group Sequence Policy Optimization"), length-normalised so a long sequence is
    not masked for its length alone.
    """
    m, w, adv, ratio, on = _setup(logprobs, behaviour_logprobs, advantages, mask, token_count, aggregation,
                                  sequence_count)
    seq_log = (ratio.log() * m).sum(-1) / m.sum(-1).clamp_min(1)  # (B,)
    geo = torch.exp(seq_log)
    keep = ((geo >= seq_mask_low) & (geo <= seq_mask_high))[:, None]  # (B, 1)
    weight = ratio.clamp_max(tis_cap) * keep
    mb = m.bool()
    return _output(weight * on * adv, logprobs, w, m, ratio, (kl_coef, ref_logprobs, entropy_coef, entropy),
                   truncated=keep & (ratio > tis_cap) & mb, masked=~keep & mb, weights=weight)


def second_moment_mask(log_ratio: torch.Tensor, mask: torch.Tensor, tau: float) -> torch.Tensor:
    """(B, T) bool: the fewest tokens, largest squared log-ratio first, whose removal brings the mean of
    log_ratio² over the remaining model tokens to ≤ tau (none when it already is). log_ratio, mask: (B, T)."""
    mb = mask.bool()
    vals = log_ratio.detach().double()[mb] ** 2  # (N,)
    n = vals.numel()
    order = torch.argsort(vals, descending=True, stable=True)
    prefix = torch.cat([vals.new_zeros(1), vals[order].cumsum(0)])  # prefix[k]: the k largest, summed
    left = n - torch.arange(n + 1, dtype=torch.float64)
    mean_left = torch.where(left > 0, (prefix[-1] - prefix) / left.clamp_min(1), vals.new_zeros(()))
    k = int(torch.nonzero(mean_left <= tau)[0])  # k = n (all masked) always qualifies
    drop = torch.zeros(n, dtype=torch.bool, device=vals.device)
    drop[order[:k]] = True
    out = torch.zeros_like(mb)
    out[mb] = drop.to(out.device)
    return out


def m2po(logprobs, behaviour_logprobs, advantages, mask, *, m2po_tau: float = 0.04, kl_coef: float = 0.0,
         entropy_coef: float = 0.0, ref_logprobs=None, entropy=None, token_count=None, aggregation: str = "token",
         sequence_count=None) -> LossOutput:
    """M2PO: a second-moment trust region. The tokens with the largest squared log-ratio
    log(pi_theta / pi_behaviour)² are `masked`, fewest first, until the mean of the squared log-ratio over the
    remaining tokens is ≤ m2po_tau; the rest take the unclipped ratio·A (no PPO clip).

    Zheng et al. 2025, "Prosperity before Collapse: How Far Can Off-Policy RL Reach with Stale Data on
    LLMs?" (M2PO; AReaL's docs/algorithms/m2po.md, `m2_threshold`; tau = 0.04, stable with data 256
    versions stale). The second moment is taken over the tokens of one call: the whole batch when it fits one
    micro-batch (learner.micro_batch_tokens) on one rank, else each micro-batch's own.
    """
    m, w, adv, ratio, _ = _setup(logprobs, behaviour_logprobs, advantages, mask, token_count, aggregation,
                                 sequence_count)
    masked = second_moment_mask(ratio.log(), m, m2po_tau)
    keep = ~masked
    live = importance_ratio(logprobs, behaviour_logprobs)  # with gradient: ratio·A is the surrogate
    return _output(live * adv * keep, logprobs, w, m, ratio, (kl_coef, ref_logprobs, entropy_coef, entropy),
                   masked=masked, weights=ratio * keep)


def decoupled_ppo(logprobs, behaviour_logprobs, advantages, mask, *, proximal_logprobs=None, proximal_alpha=None,
                  clip_low: float = 0.2, clip_high: float = 0.2, tis_cap: float = 2.0, kl_coef: float = 0.0,
                  entropy_coef: float = 0.0, ref_logprobs=None, entropy=None, token_count=None,
                  aggregation: str = "token", sequence_count=None) -> LossOutput:
    """Decoupled PPO: PPO's clip against the proximal policy pi_prox, times the behaviour weight
    pi_prox / pi_behaviour, detached and truncated at tis_cap.

    Fu et al. 2025, "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for Language
    Reasoning" (areal/utils/functional.py ppo_actor_loss_fn, `behav_imp_weight_cap`), after Hilton et al.
    2022, "Batch size-invariance for policy optimization". proximal_logprobs (B, T): the learner's weights
    before the update; None: logprobs.detach(), which they are when a batch takes one optimizer step (the
    learner's case today: the clip then never binds at the step's start and the objective's gradient is
    tis's). AReaL masks a token whose behaviour weight exceeds the cap; here it is truncated, as in `tis`.

    proximal_alpha (B,): A-3PO's approximation instead (Li et al. 2026, learner/minibatches.py `interpolation`),
    log π_prox = log π_behaviour + α (log π_θ - log π_behaviour), detached; α = 1 is log π_θ itself, exactly.
    """
    m, w, adv, ratio, _ = _setup(logprobs, behaviour_logprobs, advantages, mask, token_count, aggregation,
                                 sequence_count)
    prox = logprobs.detach() if proximal_logprobs is None else proximal_logprobs.detach()
    if proximal_alpha is not None:
        a = proximal_alpha[:, None].to(logprobs.dtype)
        step = behaviour_logprobs + a * (logprobs.detach() - behaviour_logprobs)
        prox = torch.where(a == 1, logprobs.detach(), step)
    behav = importance_ratio(prox, behaviour_logprobs)
    weight = behav.clamp_max(tis_cap)
    r = importance_ratio(logprobs, prox)
    surrogate = torch.minimum(r * adv, r.clamp(1 - clip_low, 1 + clip_high) * adv)
    mb = m.bool()
    clipped = (surrogate.detach() != (r * adv).detach()) & mb
    return _output(weight * surrogate, logprobs, w, m, ratio, (kl_coef, ref_logprobs, entropy_coef, entropy),
                   clipped=clipped, truncated=(behav > tis_cap) & mb, weights=weight)
