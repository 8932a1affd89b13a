"""The off-policy minimum-variance baseline around any objective (loss.variance_control = mvb | both).

VCPO's baseline (streamrl/algo/variance.py) weighs each sample by the importance weights its gradient carries, and
those are the current policy's over the behaviour's: they are known only after a forward pass. The step's own
forward comes micro-batch by micro-batch, backward included, while a group's baseline needs all of its samples
before the first backward. So one forward without gradients goes first, through the training forward's
micro-batches and chunks (minibatches.proximal_logprobs: bit for bit the log-probs the first optimizer step sees);
the wrapped objective computes its weights on them, and each group's advantages are shifted by
`variance.baseline_shift`. Its cost is that forward, once per batch.

Strict mode needs none of it: the objective sees behaviour = current there, every weight is exactly 1 and the shift
exactly 0 (variance.baseline_shift), so the advantages pass through untouched.
"""

from __future__ import annotations

import torch

from streamrl.algo import losses, variance
from streamrl.learner.batch import Batch
from streamrl.learner.minibatches import proximal_logprobs


def baselined(engine, batch: Batch, advantages: torch.Tensor, token_count: float | None = None,
              sequence_count: float | None = None) -> torch.Tensor:
    """(num_groups, G) `advantages` shifted per group by b*(w) - b*(1) under mvb | both, else themselves.
    token_count, sequence_count: as Engine.train_step's (the loss's token weights over the whole batch)."""
    cfg = engine.cfg
    if cfg.loss.variance_control not in ("mvb", "both") or cfg.on_policy == "strict":
        return advantages
    return advantages - shift(engine, batch, advantages, proximal_logprobs(engine, batch), token_count,
                              sequence_count)[:, None].to(advantages.dtype)


def shift(engine, batch: Batch, advantages: torch.Tensor, current: torch.Tensor, token_count: float | None = None,
          sequence_count: float | None = None) -> torch.Tensor:
    """(num_groups,) float64 baseline shift from the objective's weights at log-probs `current` (B, L-1)."""
    lc = engine.cfg.loss
    mask = batch.completion_mask
    with torch.no_grad():
        out = losses.compute(lc.name, current, batch.behaviour_logprobs, advantages.flatten(), mask,
                             **lc.objective_knobs(), token_count=token_count, sequence_count=sequence_count)
    c = losses.token_weights(mask, lc.aggregation, token_count, sequence_count)
    return variance.baseline_shift(out.filled(mask).weights, c, advantages)
