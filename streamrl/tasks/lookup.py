"""The lookup task: a task only a tool can solve, the proof that multi-turn episodes with tools train.

Each row draws a key (k1 … kK) and, independently, the symbol to answer with (a … d): the prompt shows the key
only, so without the tool an answer is a guess (1 in `task.num_symbols`). `LookupEnv` gives the model a
`lookup(key)` tool that returns the row's symbol for the prompt's key (any other key raises, and the model sees
the error); the episode's reward is 1 when the first word of the model's answer (its first reply that calls
no tool) is the symbol. `task.options.credit` (default 0) is the reward of an episode that looked the right key
up but answered wrong: a small credit lets a random-init model find the tool before it can read its result.
`LookupNoToolEnv` is the same episode without the tool (the baseline that cannot beat chance).

Single-turn (no task.environment) the task scores a completion's first word the same way.
"""

from __future__ import annotations

import random

from streamrl.tasks.base import Prompt, distinct


class Lookup:
    """Prompt: a key; columns: the key, the symbol to answer with, the credit for a right lookup."""

    def __init__(self, num_symbols: int = 4, keys: int = 4, credit: float = 0.0):
        if not 0 <= credit < 1:
            raise ValueError(f"task.options.credit={credit}: must be in [0, 1) (1 is a right answer's reward)")
        self.symbols = [chr(ord("a") + i) for i in range(num_symbols)]
        self.keys = [f"k{i + 1}" for i in range(keys)]
        self.credit = credit

    @classmethod
    def from_config(cls, cfg) -> "Lookup":
        opts = dict(cfg.options)
        unknown = set(opts) - {"keys", "credit"}
        if unknown:
            raise ValueError(f"task.options: {sorted(unknown)} unknown to the lookup task; it takes keys, credit")
        return cls(cfg.num_symbols, int(opts.get("keys", 4)), float(opts.get("credit", 0.0)))

    @staticmethod
    def levels(cfg) -> list[float]:
        credit = float(dict(cfg.options).get("credit", 0.0))
        return [0.0, credit, 1.0] if credit else [0.0, 1.0]

    @property
    def reward_levels(self) -> list[float]:
        return [0.0, self.credit, 1.0] if self.credit else [0.0, 1.0]

    @property
    def vocabulary(self) -> list[str]:
        return ["lookup", *self.keys, *self.symbols]

    def sample(self, rng: random.Random) -> Prompt:
        key, symbol = rng.choice(self.keys), rng.choice(self.symbols)
        return Prompt(id=f"lookup-{key}-{symbol}", text=key,
                      columns={"key": key, "symbol": symbol, "credit": self.credit})

    def eval_set(self, size: int | None, seed: int = 12345) -> list[Prompt]:
        if size is None:
            raise ValueError("eval.prompts=all: the lookup task has no eval file; give a number of prompts")
        return distinct(self.sample, size, seed)

    def score(self, prompt: Prompt, completion: str) -> float:
        """Single-turn: 1 when the completion's first word is the symbol (a guess: nothing shows it)."""
        words = completion.split()
        return float(bool(words) and words[0] == prompt.columns["symbol"])


class LookupEnv:
    """One episode: the key as the user's message; `lookup(key)`; reward on the first reply without a call."""

    def __init__(self, row: dict):
        self.key, self.symbol, self.credit = row["key"], row["symbol"], float(row.get("credit", 0.0))
        self.found = False
        self.tools = [self.lookup] if self.with_tool else []

    with_tool = True

    def lookup(self, key: str) -> str:
        """Look a key up and return the symbol to answer with.

        Args:
            key: The key the question names.
        """
        if key != self.key:
            raise KeyError(f"no key {key}")
        self.found = True
        return self.symbol

    def reset(self) -> list[dict]:
        return [{"role": "user", "content": self.key}]

    def step(self, reply: str) -> tuple[list[dict], float | None, bool]:
        words = reply.split()
        if words and words[0] == self.symbol:
            return [], 1.0, True
        return [], self.credit if self.found else 0.0, True


class LookupNoToolEnv(LookupEnv):
    """The same episode without the tool: the answer is a guess."""

    with_tool = False
