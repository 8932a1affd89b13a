"""The built-in symbol tasks (copy, reverse, repeat_first).

They are small enough that a random-init model learns them on 2 CPU cores in minutes: the prompt is
a string of symbols, the completion must transform it, and the reward is the fraction of positions
right (levels 0, 1/L, ..., 1 for L symbols).
"""

from __future__ import annotations

import random

from streamrl.config import TaskConfig
from streamrl.tasks.base import Prompt, TaskDefaults, distinct


class SymbolTask(TaskDefaults):
    """Prompt `<instruction> : s1 ... sL =`; the completion is scored position by position."""

    instruction = ""

    def __init__(self, num_symbols: int, length: int):
        self.symbols = [chr(ord("a") + i) for i in range(num_symbols)]
        self.length = length

    def transform(self, symbols: list[str]) -> list[str]:
        raise NotImplementedError

    @property
    def vocabulary(self) -> list[str]:
        """Every word a prompt or a correct completion uses (the offline tokenizer is built from it)."""
        return [*self.symbols, ":", "=", *(t.instruction for t in _SYMBOL_TASKS)]

    @property
    def reward_levels(self) -> list[float]:
        return [i / self.length for i in range(self.length + 1)]

    @staticmethod
    def levels(cfg: TaskConfig) -> list[float]:
        """The reward levels from the `TaskConfig` alone: 0, 1/L, ..., 1."""
        return [i / cfg.length for i in range(cfg.length + 1)]

    @classmethod
    def from_config(cls, cfg: TaskConfig) -> "SymbolTask":
        return cls(num_symbols=cfg.num_symbols, length=cfg.length)

    def eval_set(self, size: int | None, seed: int = 12345) -> list[Prompt]:
        """`size` prompts drawn from a stream of their own (distinct ids where the space allows)."""
        if size is None:
            raise ValueError("eval.prompts=all: the symbol tasks have no eval file; give a number of prompts")
        return distinct(self.sample, size, seed)

    def sample(self, rng: random.Random) -> Prompt:
        seq = [rng.choice(self.symbols) for _ in range(self.length)]
        return Prompt(
            id=f"{self.instruction}-{''.join(seq)}",
            text=f"{self.instruction} : {' '.join(seq)} =",
            target=tuple(self.transform(seq)),
        )

    def score(self, prompt: Prompt, completion: str) -> float:
        """Fraction of target positions the completion gets right; extra words are ignored."""
        words = completion.split()
        right = sum(1 for i, want in enumerate(prompt.target) if i < len(words) and words[i] == want)
        return right / len(prompt.target)


_SYMBOL_TASKS: list[type[SymbolTask]] = []


def _symbol_task(name: str):
    def add(cls: type[SymbolTask]) -> type[SymbolTask]:
        cls.instruction = name
        _SYMBOL_TASKS.append(cls)
        return cls  # registered by its entry point (pyproject.toml, group streamrl.tasks)

    return add


@_symbol_task("copy")
class Copy(SymbolTask):
    def transform(self, symbols: list[str]) -> list[str]:
        return list(symbols)


@_symbol_task("reverse")
class Reverse(SymbolTask):
    def transform(self, symbols: list[str]) -> list[str]:
        return symbols[::-1]


@_symbol_task("repeat_first")
class RepeatFirst(SymbolTask):
    def transform(self, symbols: list[str]) -> list[str]:
        return [symbols[0]] * len(symbols)
