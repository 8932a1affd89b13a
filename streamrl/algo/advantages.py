"""Group-relative advantage estimators (GRPO, static threshold, CoRPO).

Every estimator is a pure function of a `(num_groups, group_size)` reward tensor and returns a
tensor of the same shape. `R_min_correct` is the smallest reward that counts as a correct answer.
Under `static` and `corpo`, a sample with `R < R_min_correct` never gets a positive advantage,
which is the point of the paper "The Peril of Preference": GRPO's group mean can sit below the
threshold, and then failed samples are reinforced.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

from streamrl import registry
from streamrl.registry import Registry

if TYPE_CHECKING:
    import torch

# torch is imported where a tensor is made, not here: validating a config looks the estimator up in
# ESTIMATORS, and `streamrl run` must not spend torch's 2-3 s of import doing that.
Estimator = Callable[..., "torch.Tensor"]
ESTIMATORS: Registry = registry.ESTIMATORS  # one registry for every kind of plug-in (streamrl.registry)

# Below this group std the std-normalised GRPO advantage is 0 rather than a division blow-up.
_STD_EPS = 1e-6


@ESTIMATORS.register("grpo")
def grpo(rewards: torch.Tensor, r_min_correct: float, std_normalize: bool = False) -> torch.Tensor:
    """A = R - mean(R), optionally divided by the group's (population) std."""
    adv = rewards - rewards.mean(dim=1, keepdim=True)
    if std_normalize:
        std = rewards.std(dim=1, keepdim=True, unbiased=False)
        import torch

        adv = torch.where(std > _STD_EPS, adv / std.clamp_min(_STD_EPS), torch.zeros_like(adv))
    return adv


@ESTIMATORS.register("static")
def static(rewards: torch.Tensor, r_min_correct: float, std_normalize: bool = False) -> torch.Tensor:
    """A = R - R_min_correct: a fixed baseline at the correctness threshold."""
    return rewards - r_min_correct


@ESTIMATORS.register("corpo")
def corpo(rewards: torch.Tensor, r_min_correct: float, std_normalize: bool = False) -> torch.Tensor:
    """A = R - max(R_min_correct, mean(R)): GRPO's baseline clamped from below at the threshold."""
    baseline = rewards.mean(dim=1, keepdim=True).clamp_min(r_min_correct)
    return rewards - baseline


def compute(
    rewards: torch.Tensor, estimator: str, r_min_correct: float, std_normalize: bool = False, **options: Any
) -> torch.Tensor:
    """Advantages for `rewards` of shape (num_groups, group_size); returns the same shape. `options`: the
    estimator's own (an installed estimator's Options, `advantage.options_dict(ESTIMATORS)`), as keywords.

    `std_normalize` applies to `grpo` only (static and CoRPO baselines are absolute thresholds,
    and dividing by the std would change which side of the threshold a sample lands on).
    """
    import torch

    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (num_groups, group_size), got shape {tuple(rewards.shape)}")
    if not math.isfinite(float(rewards.sum(dtype=torch.float64))):  # non-finite iff some reward is
        raise ValueError("rewards contain NaN or inf; reject those groups before computing advantages")
    return ESTIMATORS.get(estimator)(rewards.float(), float(r_min_correct), std_normalize=std_normalize, **options)
