"""What every task shares: the `Prompt` a task makes, the task registry, and seeded distinct prompt sets.

A task makes prompts (`sample`, `eval_set`) and scores completions (`score`) with a reward in
[0, 1] on several levels (`reward_levels`); `streamrl.tasks.rewards` may condense those levels onto a
coarser ordinal scale, and a shaped reward at or above `advantage.r_min_correct` means "correct".
"""

from __future__ import annotations

import random
from typing import Callable

import msgspec

from streamrl.tasks.plugins import TaskRegistry


class Prompt(msgspec.Struct, frozen=True):
    id: str
    """Stable id: the same question gets the same id (difficulty filtering and pass@k group by it)."""
    text: str
    """What the policy sees."""
    target: tuple[str, ...] = ()
    """Symbol tasks: the words a fully correct completion starts with."""
    labels: tuple[float, ...] = ()
    """Verifier task: ground-truth quality of each candidate response (label_a[, label_b])."""
    messages: tuple[dict, ...] = ()
    """Chat prompts: the messages ({"role", "content"}, a system message allowed); `text` is their plain rendering."""
    columns: dict = {}
    """Dataset task: the row's other columns, passed to the reward functions as keyword lists."""


TASKS = TaskRegistry("task")


def render(messages) -> str:
    """Chat messages as plain text, for a model without a chat template (the tiny word-level one): each
    message's content on its own line, system first, so the words the policy sees are the messages' words."""
    return "\n".join(m["content"] for m in messages)


def distinct(sample: Callable[[random.Random], Prompt], size: int, seed: int) -> list[Prompt]:
    """`size` prompts with distinct ids drawn from `sample` on a stream seeded with `seed` (fewer where the space
    is smaller)."""
    rng, seen, out = random.Random(seed), set(), []
    for _ in range(size * 20):
        p = sample(rng)
        if p.id not in seen:
            seen.add(p.id)
            out.append(p)
            if len(out) == size:
                break
    return out


def build(cfg):
    """The task a `TaskConfig` names (every task class has `from_config`)."""
    return TASKS.get(cfg.name).from_config(cfg)


class RowsTask:
    """A task over data rows: `train` (rows), `eval_rows` (None without an eval file) and `prompt(row)`."""

    train: list
    eval_rows: list | None

    def prompt(self, row) -> Prompt:
        raise NotImplementedError

    def sample(self, rng: random.Random) -> Prompt:
        return self.prompt(rng.choice(self.train))

    def eval_set(self, size: int | None, seed: int = 12345) -> list[Prompt]:
        """The first `size` rows of the eval file (None: every row), else `size` distinct prompts from `sample`."""
        if self.eval_rows is not None:
            return [self.prompt(r) for r in self.eval_rows[:size]]
        if size is None:
            raise ValueError("eval.prompts=all: needs task.eval_data (only a file has a fixed size); "
                             "give a number of prompts")
        return distinct(self.sample, size, seed)
