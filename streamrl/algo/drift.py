"""A step size bounded by measured drift: the learner's lr scaled so that each version moves the policy by about
`optim.target_drift` (KL(previous version ‖ next), per token), whatever the configured lr.

Why the step size. A stale batch is corrected token by token (streamrl.algo.offpolicy), but no per-token weight can
undo a policy that moved too far between the version that sampled and the one that trains: the staleness bench
found every correction holding one task and collapsing another where consecutive versions differ by KL ~1e-2
(docs/reference/benchmarks.md, "Three tasks, two drift regimes"), and copy tasks at lr 1e-3 reached 0.90-0.99 and
fell to 0.39-0.44, the batch's KL rising from ~5e-3 to 0.1-1.5 as the policy sharpened. The drift a step causes is what
the objective must bridge; bounding it per version is a trust region measured instead of imposed. The same control
is rsl_rl's and rl_games' "adaptive" PPO learning rate (lr divided or multiplied by 1.5 when the measured KL leaves
[target / 2, 2 target]); here the update is continuous and uses that KL is quadratic in the step.

The measurement. A group sampled at version v and trained at version t carries KL(π_v ‖ π_t) over t - v versions,
estimated per token by k3 = r - 1 - log r (r = π_t / π_v, unbiased and ≥ 0). Summed over the batch's stale tokens
and divided by their summed lags it is the drift per version: exact for lag-1 groups (the last step's own drift),
an overestimate by up to the lag when consecutive steps point the same way (then stale data is damped harder, the
conservative direction). Lag-0 tokens carry no information (r = 1 up to numerics) and are left out, so a strict run
(every lag 0) keeps scale 1: its steps are unchanged.

The control. KL ≈ ½ Δθᵀ F Δθ grows with the square of the step, and the step with the lr, so the scale that brings a
measured drift d, produced at scale s, to the target is s · sqrt(target / d). Each change is bounded to a factor of
2 either way (one noisy batch cannot throw the lr away) and the scale stays in [FLOOR, 1]: never above optim.lr.
"""

from __future__ import annotations

import torch

FLOOR = 1.0 / 64
"""The smallest scale: the lr never falls below optim.lr / 64, so a run keeps learning whatever the drift."""
MAX_CHANGE = 2.0
"""The most the scale moves in one step, either way."""


def k3(ratio: torch.Tensor) -> torch.Tensor:
    """Per token, r - 1 - log r for r = π_learner / π_behaviour (any shape, in float64): ≥ 0, and its mean over tokens
    sampled from the behaviour policy estimates KL(behaviour ‖ learner) without bias."""
    r = ratio.double()
    return r - 1 - r.log()


def drift_sums(ratio: torch.Tensor, mask: torch.Tensor, lags: torch.Tensor) -> torch.Tensor:
    """(2,) float64 [Σ k3, Σ lag] over the completion tokens of rows whose lag is ≥ 1, what ranks add up before
    `per_version`. ratio: (B, T) π_learner / π_behaviour; mask: (B, T) completion tokens; lags: (B,) versions
    between each row's behaviour policy and the learner."""
    stale = mask.bool() & (lags.view(-1, 1) >= 1)
    lag = lags.view(-1, 1).expand_as(mask)[stale].double()
    return torch.stack([k3(ratio[stale]).sum(), lag.sum()])


def per_version(sums: torch.Tensor) -> float | None:
    """The drift per version, Σ k3 / Σ lag, from `drift_sums`; None when the batch has no stale token."""
    k3, lags = (float(x) for x in sums)
    return max(0.0, k3) / lags if lags > 0 else None


def next_scale(scale: float, drift: float | None, target: float) -> float:
    """The lr scale of the coming step, from the last step's `scale` and the batch's measured `drift` per version:
    scale · sqrt(target / drift), moved by at most MAX_CHANGE either way, within [FLOOR, 1]. Unchanged when there is
    no measurement (drift None); a drift of 0 raises it by MAX_CHANGE (up to 1)."""
    if drift is None:
        return scale
    factor = MAX_CHANGE if drift <= 0 else min(MAX_CHANGE, max(1 / MAX_CHANGE, (target / drift) ** 0.5))
    return min(1.0, max(FLOOR, scale * factor))
