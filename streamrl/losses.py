"""Policy losses: small pure functions in a registry.

All tensors are per token, shape (B, T) for B samples padded to T completion tokens, with `mask`
(B, T) = 1 on real completion tokens. `advantages` is (B,), one value per sample.
"""

from __future__ import annotations

from typing import Callable

import msgspec
import torch

from streamrl.registry import Registry

# exp() of a log-ratio beyond this is clamped, so a wildly off-policy token cannot overflow to inf.
_MAX_LOG_RATIO = 20.0


class LossOutput(msgspec.Struct):
    loss: torch.Tensor
    """Scalar to backpropagate."""
    token_loss: torch.Tensor
    """(B, T) policy-gradient loss per token (0 on padding), already divided by the token count."""
    ratio: torch.Tensor
    """(B, T) importance ratio pi_theta / pi_behaviour (detached)."""
    clipped: torch.Tensor
    """(B, T) bool: token whose gradient the PPO clip or the truncation cap removed."""


LossFn = Callable[..., LossOutput]
LOSSES: Registry[LossFn] = Registry("loss")


@LOSSES.register("token_pg")
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
) -> LossOutput:
    """Token-level clipped policy gradient with the importance ratio against the behaviour policy.

    ratio = pi_theta / pi_behaviour. PPO's min(ratio·A, clip(ratio)·A) bounds the ratio for A > 0;
    for A < 0 it does not, so the objective is floored at is_cap·A (truncated importance sampling,
    "dual clip"). Losses are summed over tokens and divided by the number of real tokens in the
    batch, so long and short completions weigh per token, as in DAPO.
    """
    mask = mask.to(logprobs.dtype)
    # Data-parallel ranks pass the batch's token count over the world size, so the gradients
    # DeepSpeed averages across ranks equal those of one rank holding the whole batch.
    n_tokens = mask.sum().clamp_min(1.0) if token_count is None else torch.tensor(float(token_count))
    adv = advantages[:, None].to(logprobs.dtype)
    log_ratio = (logprobs - behaviour_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip_low, 1 + clip_high) * adv)
    surrogate = torch.where(adv < 0, torch.maximum(surrogate, is_cap * adv), surrogate)
    token_loss = -surrogate * mask / n_tokens
    loss = token_loss.sum()
    if kl_coef and ref_logprobs is not None:
        # k3 estimator of KL(pi_theta || pi_ref): unbiased and always >= 0.
        d = (ref_logprobs - logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        loss = loss + kl_coef * ((torch.exp(d) - d - 1) * mask).sum() / n_tokens
    if entropy_coef and entropy is not None:
        loss = loss - entropy_coef * (entropy * mask).sum() / n_tokens
    with torch.no_grad():
        unclipped = ratio * adv
        clipped = (surrogate.detach() != unclipped) & mask.bool()
    return LossOutput(loss=loss, token_loss=token_loss.detach(), ratio=ratio.detach(), clipped=clipped)


def compute(name: str, logprobs, behaviour_logprobs, advantages, mask, **kwargs) -> LossOutput:
    return LOSSES.get(name)(logprobs, behaviour_logprobs, advantages, mask, **kwargs)
