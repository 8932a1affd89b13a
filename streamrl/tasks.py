"""Prompt sources with ordinal (partial-credit) rewards, in a registry.

A task makes prompts (`sample`, `eval_set`) and scores completions (`score`) with a reward in
[0, 1] on several levels (`reward_levels`); `streamrl.rewards` may condense those levels onto a
coarser ordinal scale, and a shaped reward at or above `advantage.r_min_correct` means "correct".
The pairwise code verifier of the paper is in `streamrl.verifier`. The built-in symbol tasks are
small enough that a random-init model learns them on 2 CPU cores in minutes: the prompt is a
string of symbols, the completion must transform it, and the reward is the fraction of positions
right (levels 0, 1/L, ..., 1 for L symbols).
"""

from __future__ import annotations

import random
from typing import Callable

import msgspec

from streamrl.registry import Registry


class Prompt(msgspec.Struct, frozen=True):
    id: str
    """Stable id: the same question gets the same id (difficulty filtering and pass@k group by it)."""
    text: str
    """What the policy sees."""
    target: tuple[str, ...] = ()
    """Symbol tasks: the words a fully correct completion starts with."""
    labels: tuple[float, ...] = ()
    """Verifier task: ground-truth quality of each candidate response (label_a[, label_b])."""


class SymbolTask:
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

    @classmethod
    def from_config(cls, cfg) -> "SymbolTask":
        return cls(num_symbols=cfg.num_symbols, length=cfg.length)

    def eval_set(self, size: int, seed: int = 12345) -> list[Prompt]:
        """`size` prompts drawn from a stream of their own (distinct ids where the space allows)."""
        return _distinct(self.sample, size, seed)

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


TASKS: Registry[Callable[..., SymbolTask]] = Registry("task")
_SYMBOL_TASKS: list[type[SymbolTask]] = []


def _symbol_task(name: str):
    def add(cls: type[SymbolTask]) -> type[SymbolTask]:
        cls.instruction = name
        _SYMBOL_TASKS.append(cls)
        return TASKS.register(name)(cls)

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


def _distinct(sample: Callable[[random.Random], Prompt], size: int, seed: int) -> list[Prompt]:
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


# The data-backed tasks register themselves; imported last because they build on the definitions above.
from streamrl import math_answer, verifier  # noqa: E402, F401
