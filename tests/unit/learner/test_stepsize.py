"""learner.stepsize: the ESS scale goes on the learning rate of the step it belongs to (AdamW ignores a scaled loss),
from the schedule itself, so it never compounds; scale 1 leaves the scheduler's lr bit for bit."""

from __future__ import annotations

import torch

from streamrl.learner import stepsize


def _adamw_delta(lr: float, loss_scale: float) -> torch.Tensor:
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(8, dtype=torch.float64))  # float64: the deltas are exact enough to compare
    start = p.detach().clone()
    opt = torch.optim.AdamW([p], lr=lr, weight_decay=0.01)
    (loss_scale * (p * torch.arange(8.0, dtype=torch.float64)).sum()).backward()
    opt.step()
    return p.detach() - start


def test_adamw_ignores_a_scaled_loss_and_follows_a_scaled_learning_rate():
    base = _adamw_delta(1e-3, 1.0)
    assert torch.allclose(_adamw_delta(1e-3, 0.25), base, rtol=1e-4, atol=0)  # scaling the loss: same step
    assert torch.allclose(_adamw_delta(0.25e-3, 1.0), 0.25 * base, rtol=1e-5, atol=0)  # scaling the lr: 1/4 step


def _scheduled():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([p], lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: stepsize.lr_factor(s, 4, 10, "cosine"))
    return p, opt, sched


def test_the_scale_multiplies_the_scheduled_lr_without_compounding_and_the_scheduler_takes_over_after_the_step():
    p, opt, sched = _scheduled()
    scheduled = opt.param_groups[0]["lr"]  # 0.1 · 1/4 (warm-up step 0)
    stepsize.set_lr(opt, sched, 1.0)
    assert opt.param_groups[0]["lr"] == scheduled  # bit for bit
    stepsize.set_lr(opt, sched, 0.5)
    stepsize.set_lr(opt, sched, 0.5)  # twice: still half the schedule's, not a quarter
    assert opt.param_groups[0]["lr"] == scheduled * 0.5
    p.grad = torch.ones(2)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == 0.1 * stepsize.lr_factor(1, 4, 10, "cosine")  # the next step's, unscaled
