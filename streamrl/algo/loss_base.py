"""What every policy loss shares: its output, the token weights, the ratio, the KL and entropy terms, and the
registry (`streamrl.algo.losses` registers token_pg, `streamrl.algo.offpolicy` the off-policy objectives; import
`losses` to have them all).

All tensors are per token, shape (B, T) for B samples padded to T completion tokens, with `mask`
(B, T) = 1 on the completion tokens the model sampled: 0 on padding and on a multi-turn episode's
environment tokens, which get no loss, no gradient and no place in any count. `advantages` is (B,),
one value per sample.
How token losses add up (`aggregation`): `token_weights` below, and `streamrl.algo.losses`'s docstring.
"""

from __future__ import annotations

from typing import Callable

import msgspec
import torch

from streamrl import registry
from streamrl.registry import Registry

# exp() of a log-ratio beyond this is clamped, so a wildly off-policy token cannot overflow to inf.
_MAX_LOG_RATIO = 20.0


class LossOutput(msgspec.Struct):
    loss: torch.Tensor
    """Scalar to backpropagate."""
    token_loss: torch.Tensor
    """(B, T) policy-gradient loss per token (0 on padding), already weighted (token_weights)."""
    ratio: torch.Tensor
    """(B, T) importance ratio pi_theta / pi_behaviour (detached)."""
    clipped: torch.Tensor
    """(B, T) bool: token whose gradient the PPO clip or the truncation cap removed."""
    truncated: torch.Tensor | None = None
    """(B, T) bool: token whose importance weight was capped (its gradient kept, scaled down); None: all False."""
    masked: torch.Tensor | None = None
    """(B, T) bool: token an importance-sampling mask took out (no gradient at all); None: all False."""
    weights: torch.Tensor | None = None
    """(B, T) importance weight each token's gradient carries (detached; 0 where masked, 0 on padding);
    None: `ratio`. Their effective sample size is the telemetry's `is_ess_fraction`."""

    def filled(self, mask: torch.Tensor) -> "LossOutput":
        """The same output with truncated, masked and weights made explicit tensors (B, T)."""
        none = torch.zeros_like(self.clipped, dtype=torch.bool)
        return LossOutput(loss=self.loss, token_loss=self.token_loss, ratio=self.ratio, clipped=self.clipped,
                          truncated=none if self.truncated is None else self.truncated,
                          masked=none if self.masked is None else self.masked,
                          weights=(self.ratio * mask.to(self.ratio.dtype)) if self.weights is None else self.weights)


AGGREGATIONS = ("token", "sequence")


def token_weights(mask: torch.Tensor, aggregation: str = "token", token_count: float | None = None,
                  sequence_count: float | None = None) -> torch.Tensor:
    """(B, T) weight of each token's loss, 0 on padding; the weights of a whole batch sum to 1
    (or less, where some sequences have no token).

    "token": mask / N, N the batch's real tokens. "sequence": mask / (|o_i| · S), |o_i| sequence i's
    real tokens and S the batch's sequences (an empty one counts in S and weighs nothing).
    token_count / sequence_count: N and S of the whole batch when `mask` holds only part of it
    (a micro-batch; a data-parallel rank passes the whole batch's over the world size), so the
    parts' losses add up to the whole's; default: `mask`'s own.
    """
    mask = mask.to(torch.get_default_dtype()) if not mask.is_floating_point() else mask
    if aggregation == "token":
        n = mask.sum().clamp_min(1.0) if token_count is None else torch.tensor(float(token_count), dtype=mask.dtype)
        return mask / n
    if aggregation == "sequence":
        s = float(mask.shape[0] if sequence_count is None else sequence_count)
        return mask / (mask.sum(-1, keepdim=True).clamp_min(1.0) * max(s, 1.0))
    raise ValueError(f"aggregation={aggregation!r}: allowed {', '.join(AGGREGATIONS)}")


LossFn = Callable[..., LossOutput]
LOSSES: Registry = registry.LOSSES  # one registry for every kind of plug-in (streamrl.registry)


def regularised(loss: torch.Tensor, logprobs: torch.Tensor, w: torch.Tensor, kl_coef: float,
                ref_logprobs: torch.Tensor | None, entropy_coef: float, entropy: torch.Tensor | None) -> torch.Tensor:
    """`loss` plus the KL penalty against the reference policy and minus the entropy bonus, each token
    weighted by w (B, T) as the policy-gradient term is."""
    if kl_coef and ref_logprobs is not None:
        # k3 estimator of KL(pi_theta || pi_ref): unbiased and always >= 0.
        d = (ref_logprobs - logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        loss = loss + kl_coef * ((torch.exp(d) - d - 1) * w).sum()
    if entropy_coef and entropy is not None:
        loss = loss - entropy_coef * (entropy * w).sum()
    return loss


def importance_ratio(logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor) -> torch.Tensor:
    """(B, T) pi_theta / pi_behaviour, the log-ratio clamped so an off-policy token cannot overflow."""
    return torch.exp((logprobs - behaviour_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
