"""Epochs over a rows task (`task.epochs`): each epoch is a seeded permutation of the rows.

`order(rows, seed, epoch)` is the one permutation every process computes alike (the learner's dealer and a
test reproduce it from the seed alone). `planned_steps` is how many optimizer steps the epochs fill; the run
ends there unless `steps` is smaller. The learner deals each epoch's prompts (`streamrl.tasks.dealer`).
Procedural tasks (no rows) keep sampling with replacement; `task.epochs: 0` leaves a rows task doing so too.
"""

from __future__ import annotations

import math
import random

from streamrl.config import Config


def order(rows: int, seed: int, epoch: int) -> list[int]:
    """Row indices 0..rows-1 in epoch `epoch`'s order: the same for the same (rows, seed, epoch) everywhere."""
    if rows < 1:
        raise ValueError(f"epochs need at least one usable row, got {rows}")
    perm = list(range(rows))
    random.Random(f"epoch-{seed}-{epoch}").shuffle(perm)  # a string seed: stable across Python versions
    return perm


def planned_steps(steps: int, rows: int, epochs: int, batch_groups: int) -> int:
    """Optimizer steps of `epochs` passes over `rows` prompts at `batch_groups` groups a step (the last step
    takes what the last epoch leaves), at most `steps`."""
    if epochs < 1:
        return steps
    return max(1, min(steps, math.ceil(rows * epochs / batch_groups)))


def plan(cfg: Config, rows: int):
    """`cfg` with `steps` following from `task.epochs` over `rows` prompts (unchanged without epochs)."""
    import msgspec

    if not cfg.task.epochs:
        return cfg
    return msgspec.structs.replace(cfg, steps=planned_steps(cfg.steps, rows, cfg.task.epochs,
                                                            cfg.learner.batch_groups))


def rows_of(cfg: Config) -> int | None:
    """Usable rows of task.data, counted as the task will load them (a streaming scan); None if it cannot tell
    (the task then reports the problem itself when it loads)."""
    from streamrl.tasks import TASKS, data
    from streamrl.tasks.base import optional

    row_converter = optional(TASKS.get(cfg.task.name), "row_converter")
    if not cfg.task.data or row_converter is None:
        return None
    try:
        return data.scan(cfg.task.data, row_converter(cfg.task), cfg.task.max_row_bytes).usable or None
    except (ValueError, OSError):
        return None


def describe(cfg: Config, rows: int) -> str:
    """The line printed at start: epochs, rows, the steps they fill."""
    fill = math.ceil(rows * cfg.task.epochs / cfg.learner.batch_groups)
    end = "" if cfg.steps >= fill else f"; steps={cfg.steps} ends it first"
    return (f"{cfg.task.epochs} epoch{'s' if cfg.task.epochs > 1 else ''} over {rows:,} rows "
            f"at {cfg.learner.batch_groups} groups a step: {fill:,} steps{end}")
