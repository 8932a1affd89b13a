"""Policy losses: small pure functions in a registry.

All tensors are per token, shape (B, T) for B samples padded to T completion tokens, with `mask`
(B, T) = 1 on the completion tokens the model sampled: 0 on padding and on a multi-turn episode's
environment tokens, which get no loss, no gradient and no place in any count. `advantages` is (B,),
one value per sample.

How a batch's token losses add up to one number is `aggregation` (`loss.aggregation`): "token"
divides by the batch's token count, so every token weighs the same (DAPO); "sequence" takes the
mean over each sequence's tokens, then the mean over sequences (GRPO's and MGRPO's
1/G Σ_i 1/|o_i| Σ_t), so a short completion weighs as much as a long one.

What the losses share (LossOutput, token_weights, LOSSES) is `streamrl.algo.loss_base`'s, re-exported here; the
off-policy objectives are `streamrl.algo.offpolicy`'s, registered when this module is imported.
"""

from __future__ import annotations

import functools

import torch

from streamrl.algo.loss_base import (  # noqa: F401  (re-exported: the learner and tests use losses.*)
    _MAX_LOG_RATIO,
    AGGREGATIONS,
    LOSSES,
    LossFn,
    LossOutput,
    importance_ratio,
    regularised,
    token_weights,
)


def token_pg(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    is_cap: float = 2.0,
    kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    token_count: float | None = None,
    aggregation: str = "token",
    sequence_count: float | None = None,
) -> LossOutput:
    """Token-level clipped policy gradient with the importance ratio against the behaviour policy.

    ratio = pi_theta / pi_behaviour. PPO's min(ratio·A, clip(ratio)·A) bounds the ratio for A > 0;
    for A < 0 it does not, so the objective is floored at is_cap·A (truncated importance sampling,
    "dual clip"). Token losses are weighted by `token_weights` (aggregation "token": per token over
    the batch, as in DAPO; "sequence": per sequence, then over sequences, as in GRPO and MGRPO); the
    KL and entropy terms are weighted the same way.
    """
    mask = mask.to(logprobs.dtype)
    # Data-parallel ranks pass the batch's counts over the world size, so the gradients DeepSpeed
    # averages across ranks equal those of one rank holding the whole batch.
    w = token_weights(mask, aggregation, token_count, sequence_count).to(logprobs.dtype)
    adv = advantages[:, None].to(logprobs.dtype)
    log_ratio = (logprobs - behaviour_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip_low, 1 + clip_high) * adv)
    surrogate = torch.where(adv < 0, torch.maximum(surrogate, is_cap * adv), surrogate)
    token_loss = -surrogate * w
    loss = regularised(token_loss.sum(), logprobs, w, kl_coef, ref_logprobs, entropy_coef, entropy)
    with torch.no_grad():
        unclipped = ratio * adv
        # the dual clip's floor removes the gradient (a constant), so it counts as clipped, not truncated
        clipped = (surrogate.detach() != unclipped) & mask.bool()
    return LossOutput(loss=loss, token_loss=token_loss.detach(), ratio=ratio.detach(), clipped=clipped,
                      weights=ratio.detach() * mask)


def compute(name: str, logprobs, behaviour_logprobs, advantages, mask, **kwargs) -> LossOutput:
    """The loss `name` on the batch; of `kwargs` (the whole `loss` section's knobs) each objective takes
    those its signature names, so an objective's own knobs (tis_cap, m2po_tau, ...) reach only it."""
    fn = LOSSES.get(name)
    unknown = set(kwargs) - set().union(*(_parameters(LOSSES.get(n)) for n in LOSSES.names()))
    if unknown:  # a typo must not vanish in the filtering below
        raise TypeError(f"losses.compute({name!r}): no loss takes {', '.join(sorted(unknown))}")
    accepted = _parameters(fn)
    return fn(logprobs, behaviour_logprobs, advantages, mask, **{k: v for k, v in kwargs.items() if k in accepted})


@functools.lru_cache(maxsize=None)
def _parameters(fn) -> frozenset[str]:
    import inspect

    return frozenset(inspect.signature(fn).parameters)
