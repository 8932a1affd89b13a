"""An example streamrl task from a package of its own: write the prompt's symbols with the first two swapped.

A task is a class with `from_config(task_cfg)`, `levels(task_cfg)` (its reward scale, from the config alone),
`reward_levels`, `sample(rng) -> Prompt`, `eval_set(size, seed)`, `score(prompt, completion) -> float` and
`vocabulary` (the words the tiny word-level model needs): the `streamrl.tasks.base.Task` protocol. Its optional
members it leaves to their defaults (`streamrl.tasks.base.TaskDefaults`). This one gives partial credit: the share of the
target's positions the completion gets right (levels 0, 1/n, ..., 1). Its own keys of the `task` section are its
`Options` (a msgspec Struct, one docstring per field): the config checks them, `task.length=...` sets them.
"""

from __future__ import annotations

import random

from typing import Annotated

from msgspec import Meta

from streamrl.registry import Options
from streamrl.tasks import Prompt, distinct

SYMBOLS = "abcdefghijklmnopqrstuvwxyz"


class SwapOptions(Options):
    num_symbols: Annotated[int, Meta(ge=2, le=26)] = 4
    """Alphabet size: the prompts' symbols are the first num_symbols letters."""
    length: Annotated[int, Meta(ge=1, le=64)] = 4
    """Prompt length in symbols."""


class Swap:
    Options = SwapOptions  # the keys this task adds to the `task` section

    def __init__(self, num_symbols: int, length: int):
        self.symbols, self.length = list(SYMBOLS[:num_symbols]), max(2, length)

    @classmethod
    def from_config(cls, cfg) -> "Swap":
        return cls(cfg.num_symbols, cfg.length)

    @staticmethod
    def levels(cfg) -> list[float]:
        n = max(2, cfg.length)
        return [i / n for i in range(n + 1)]

    @property
    def reward_levels(self) -> list[float]:
        return [i / self.length for i in range(self.length + 1)]

    def sample(self, rng: random.Random) -> Prompt:
        words = [rng.choice(self.symbols) for _ in range(self.length)]
        target = [words[1], words[0], *words[2:]]
        return Prompt(id="swap-" + "".join(words), text=" ".join(["swap", ":", *words, "="]), target=tuple(target))

    def eval_set(self, size: int | None, seed: int = 12345) -> list[Prompt]:
        return distinct(self.sample, size or 32, seed)

    def score(self, prompt: Prompt, completion: str) -> float:
        words = completion.split()
        return sum(i < len(words) and words[i] == w for i, w in enumerate(prompt.target)) / len(prompt.target)

    @property
    def vocabulary(self) -> list[str]:
        return [*self.symbols, "swap", ":", "="]
