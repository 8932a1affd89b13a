"""torch's AdamW, without importing torch._dynamo on its first call.

torch wraps Optimizer's add_param_group, zero_grad, state_dict, load_state_dict (`torch._disable_dynamo`)
and Adam's step (`_use_grad_for_differentiable`) so that torch.compile does not trace them; each
wrapper imports torch._dynamo when first called, compiling or not. That import (sympy,
torch.fx.experimental.symbolic_shapes, torch.distributed.fsdp, dynamo's trace rules) took 1.8 s of
the learner's 2.4 s from fork to a built engine once the tiny model stopped importing transformers'
modeling code (which had imported it first). The learner never compiles, so this subclass calls the
wrapped functions themselves (`__wrapped__`, set by functools.wraps), with gradients off around
`step` as the wrapper sets them: the same arithmetic, the same state and state dict (a test steps it
against torch.optim.AdamW bit for bit and checks that torch._dynamo stays unimported). Where a torch
release has no wrapper there, the method itself is called, as torch.optim.AdamW would.

The engine uses it at ZeRO stage 0 (the default): DeepSpeed's ZeRO optimizers accept only torch's
exact classes, so stages 1-3 keep torch.optim.AdamW.
"""

from __future__ import annotations

import inspect

import torch


def _unwrapped(method):
    """The function under torch's wrappers (dynamo-disabling, and the profiler hook torch puts around
    the `step` of a class once it has an instance); itself where there is none."""
    return inspect.unwrap(method)


_ADD_PARAM_GROUP = _unwrapped(torch.optim.Optimizer.add_param_group)
_ZERO_GRAD = _unwrapped(torch.optim.Optimizer.zero_grad)
_STATE_DICT = _unwrapped(torch.optim.Optimizer.state_dict)
_LOAD_STATE_DICT = _unwrapped(torch.optim.Optimizer.load_state_dict)
_STEP = _unwrapped(torch.optim.AdamW.step)


class AdamW(torch.optim.AdamW):
    """torch.optim.AdamW whose methods skip torch.compile's wrappers (never compiled: see the module docstring)."""

    def add_param_group(self, param_group: dict) -> None:
        _ADD_PARAM_GROUP(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _ZERO_GRAD(self, set_to_none)

    def state_dict(self):
        return _STATE_DICT(self)

    def load_state_dict(self, state_dict) -> None:
        _LOAD_STATE_DICT(self, state_dict)

    def step(self, closure=None):
        # What `_use_grad_for_differentiable` does around it, less the import (torch hooks the profiler
        # around this method itself, as for any optimizer class).
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return _STEP(self, closure)


def step_unless_no_gradient(engine, scheduler, grad_norm: float | None) -> bool:
    """DeepSpeed `engine`'s optimizer step, unless the gradient is exactly zero (`grad_norm` == 0: every advantage
    of the batch is 0 and no term of the loss is independent of them). Returns whether it skipped.

    Adam's step on a zero gradient is not nothing: it moves the weights along the momentum and decays both moments.
    A run whose task the model masters (the tiny job at reward 1.00: over 90% of its batches) gets thousands of
    them; the second moment v, an average over ~1/(1 - β2) steps, decays toward 0 (‖√v‖ 0.35 → 0.03 while the
    batches with a signal kept gradients of ~0.01), and the first batch with a failed sample and a larger
    gradient then moved every weight by ~1 lr (rms; up to 3 lr) where such batches had moved them by 0.01-0.03 lr:
    the default job fell from 1.00 to 0.25 after ~4,000 steps in every seed (docs/reference/benchmarks.md,
    "Stability"). Skipped, the weights and both moments stay as they were: Adam's scale is the signal's.
    The lr schedule still ticks: it counts batches, not optimizer steps. grad_norm None (ZeRO 1-3: the norm is
    known only inside DeepSpeed's step): the step is taken."""
    if grad_norm != 0.0:
        engine.step()
        return False
    engine.zero_grad()
    if scheduler is not None:
        scheduler.step()
    return True
