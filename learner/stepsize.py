"""The learning rate of each optimizer step: the schedule's, times the step's ESS scale under
loss.variance_control = ess_step | both (VCPO, streamrl/algo/variance.py), times the drift scale under
optim.target_drift (streamrl/algo/drift.py).

Adam divides the gradient by its running RMS, so scaling the loss (or the gradient) by s leaves the update nearly
unchanged: a step is damped by its learning rate. `scale_step` sets the lr of the coming optimizer step to the
schedule's value times the scale, computed from the schedule itself (never from the lr in place), so a scale
cannot compound across steps, and DeepSpeed's scheduler step after the optimizer's sets the next lr afresh.
"""

from __future__ import annotations

import math

import torch

from streamrl.algo import drift, variance


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


def scale_step(engine, out, batch, version: int | None) -> tuple[float, float | None]:
    """The lr scale of the coming optimizer step, set on its lr, and the batch's measured drift per version (None
    without optim.target_drift or a stale token): the ESS scale (1.0 unless loss.variance_control has ess_step)
    times the drift scale (engine.drift_scale, 1.0 unless optim.target_drift; updated here from this batch).

    out: the step's LossOutput, its (B, T) ratio and importance weights; batch: its (B, T) completion mask and
    (groups,) policy versions; version: the learner's version the batch is consumed at (None: every lag 0, no
    drift measured).
    With several ranks the sums are all-reduced, so every rank takes the same scale, that of the whole batch."""
    lc, target = engine.cfg.loss, engine.cfg.optim.target_drift
    mask = batch.completion_mask
    scale, drift_now, ess_step = 1.0, None, lc.variance_control in ("ess_step", "both")
    if ess_step:
        sums = _summed(engine, variance.ess_sums(out.weights, mask))
        scale = variance.step_scale(variance.ess_fraction_of(sums), lc.ess_step_rule, lc.ess_step_floor)
    if target is not None:  # on every rank alike (its sums are all-reduced), even with no version to measure from
        # a group sampled across versions (in-flight updates) counts from its oldest: its drift per version reads low
        lags = batch.sample_lags(version)
        drift_now = drift.per_version(_summed(engine, drift.drift_sums(out.ratio, mask, lags)))
        engine.drift_scale = drift.next_scale(engine.drift_scale, drift_now, target)
        scale *= engine.drift_scale
    if ess_step or target is not None:
        set_lr(engine.optimizer, engine.scheduler, scale)
    return scale, drift_now


def _summed(engine, sums: torch.Tensor) -> torch.Tensor:
    """`sums` added up over the learner's ranks (itself on one rank), on the host."""
    if engine.world > 1:
        import torch.distributed as dist

        from streamrl.comm.weights.collective import collective_device

        sums = sums.to(collective_device(dist.get_backend()))
        dist.all_reduce(sums)
    return sums.cpu()
