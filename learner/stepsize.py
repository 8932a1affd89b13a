"""The learning rate of each optimizer step: the schedule's, times the step's ESS scale under
loss.variance_control = ess_step | both (VCPO, streamrl/algo/variance.py).

Adam divides the gradient by its running RMS, so scaling the loss (or the gradient) by s leaves the update nearly
unchanged: a step is damped by its learning rate. `scale_step` sets the lr of the coming optimizer step to the
schedule's value times the scale, computed from the schedule itself (never from the lr in place), so a scale
cannot compound across steps, and DeepSpeed's scheduler step after the optimizer's sets the next lr afresh.
"""

from __future__ import annotations

import math

import torch

from streamrl.algo import variance


def lr_factor(step: int, warmup: int, total: int, schedule: str) -> float:
    """Multiplier on the peak lr for optimizer step `step` (0-based): linear warm-up over `warmup`
    steps, then constant or cosine decay reaching 0 after step `total` - 1."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "cosine":
        progress = (step - warmup + 1) / max(1, total - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return 1.0


def set_lr(optimizer, scheduler, scale: float = 1.0) -> None:
    """Each param group's lr: its base lr times the schedule's factor at the scheduler's position, times `scale`."""
    for group, base, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * factor(scheduler.last_epoch) * scale


def scale_step(engine, weights: torch.Tensor, mask: torch.Tensor) -> float:
    """The ESS scale of the coming optimizer step (1.0 unless loss.variance_control has ess_step), set on its lr.

    weights, mask: (B, T) this rank's importance weights (LossOutput.weights) and completion mask; with several
    ranks their sums are all-reduced, so every rank takes the same scale, that of the whole batch."""
    lc = engine.cfg.loss
    if lc.variance_control not in ("ess_step", "both"):
        return 1.0
    sums = variance.ess_sums(weights, mask)
    if engine.world > 1:
        import torch.distributed as dist

        from streamrl.comm.weights.collective import collective_device

        sums = sums.to(collective_device(dist.get_backend()))
        dist.all_reduce(sums)
    scale = variance.step_scale(variance.ess_fraction_of(sums.cpu()), lc.ess_step_rule, lc.ess_step_floor)
    set_lr(engine.optimizer, engine.scheduler, scale)
    return scale
