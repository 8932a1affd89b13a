"""What is due after a training step besides the step itself: publishing, weight statistics,
evaluation, a checkpoint.

Rank 0 (`learner.main`) and ranks > 0 (`learner.follower`) both ask `due`: under ZeRO-3 each of
these gathers the whole weights, a collective every rank must enter at the same step, so the two
loops must never disagree about it (a disagreement hangs a multi-rank run until the collective
times out).
"""

from __future__ import annotations

from typing import NamedTuple

from streamrl.config import Config


class Due(NamedTuple):
    """What follows step `step`, in this order (the order ranks enter the gathers)."""

    publish: bool
    """Publish the new weights (learner version + 1) to the actors."""
    weight_stats: bool
    """Weight norms for the step's metrics record."""
    evaluate: bool
    """Ask the actors to evaluate the new policy (published, then) on the eval sets; no rank gathers for it."""
    checkpoint: bool
    """Save a checkpoint once the step is counted."""


def due(step: int, learner_version: int, cfg: Config) -> Due:
    """What is due after training step `step` (0-based), taken at `learner_version` (the step makes
    learner_version + 1)."""
    L, done = cfg.learner, step + 1
    evaluate = _every(done, cfg.eval.every)  # the actors evaluate a published version: it is published
    return Due(publish=(learner_version + 1) % L.publish_every == 0 or evaluate,
               weight_stats=_every(done, L.weight_stats_every),
               evaluate=evaluate,
               checkpoint=_every(done, L.checkpoint_every))


def _every(n: int, every: int) -> bool:
    """n is a multiple of `every` (0: never)."""
    return bool(every) and n % every == 0
