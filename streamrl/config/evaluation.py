"""The `eval` section: pass@k and mean@k on a fixed prompt set."""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from streamrl.config.base import PositiveInt, NonNegInt, PositiveFloat, NonNegFloat, _Section


class EvalConfig(_Section):
    every: NonNegInt = 0
    """Every this many learner steps the actors evaluate the version just published, on their engines (0: never)."""
    every_epoch: bool = False
    """With task.epochs: the actors also evaluate the version published at the end of each epoch (its last prompt trained)."""
    prompts: PositiveInt | Literal["all"] = 32
    """Eval set size: prompts from the task's eval_set (fixed across evaluations); all: every row of task.eval_data."""
    samples: PositiveInt = 8
    """Completions sampled per eval prompt (n of pass@k)."""
    ks: list[PositiveInt] = msgspec.field(default_factory=lambda: [1, 4, 8])
    """k values reported as pass@k and mean@k; each at most `samples`."""
    temperature: NonNegFloat = 1.0
    """Sampling temperature for evaluation (0: greedy, the most likely token)."""
    max_new_tokens: PositiveInt | None = None
    """Completion length cap for evaluation (null: actors.max_new_tokens)."""
    seed: int = 12345
    """Seed of the eval prompt set and of eval sampling (every evaluation sees the same prompts)."""
    sets: dict[str, str] = {}
    """Named eval sets {name: file} (any file task.eval_data takes), each reported as eval/<name>/<metric>; {}: the task's own."""
    actors: PositiveInt = 1
    """Actors that share each in-training evaluation (each set split into this many shards, run on their engines)."""
    timeout_s: PositiveFloat = 1800.0
    """An eval shard not answered this long after it was asked for is asked of another actor."""

    @property
    def size(self) -> int | None:
        """The eval set size a task's eval_set takes (None: every row)."""
        return None if self.prompts == "all" else self.prompts

    def __post_init__(self) -> None:
        if not self.ks:
            raise ValueError("ks=[]: give at least one k (each 1..samples)")
        if bad := [k for k in self.ks if k > self.samples]:
            raise ValueError(f"ks={self.ks}: {bad} exceed samples={self.samples}; each k must be 1..samples")
        if bad := [name for name in self.sets if not re.fullmatch(r"[A-Za-z0-9_.-]+", name)]:
            raise ValueError(f"sets: names {bad} must be letters, digits, '_', '.' or '-' (they become eval/<name>/...)")

