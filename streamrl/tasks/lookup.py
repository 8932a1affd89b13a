"""The lookup task: a task only a tool can solve, the proof that multi-turn episodes with tools train.

Each row draws a table (a symbol a … d for each key k1 … kK, independently) and the key asked about: the prompt
shows the key only, so without the tool an answer is a guess (1 in `task.num_symbols`). `LookupEnv` gives the
model a `lookup(key)` tool that returns the table's symbol for a key (a word that is no key raises, and the model
sees the error); the episode's reward is 1 when the model's answer (its first reply that calls no tool) says
`answer <symbol>` with the asked key's symbol. A call (`lookup k2`) and an answer (`answer b`) are both two words,
so a random-init model stumbles on either as often, and guessing is not favoured over looking up. Partial credit lets a random-init model find the tool before it can read its result:
`task.options.credit` (default 0) rewards an episode that looked the right key up but answered wrong, and
`task.options.call_credit` (default 0) one that looked some other key up. Both stay
below 1, and a run's mean reward can pass `credit + (1 - credit) / num_symbols` only by answering right.
`LookupNoToolEnv` is the same episode without the tool (the baseline that cannot beat chance).

Single-turn (no task.environment) the task scores a completion's first word the same way.
"""

from __future__ import annotations

import random

from streamrl.config import TaskConfig
from streamrl.tasks.base import Prompt, TaskDefaults, distinct
from streamrl.tasks.environments import EnvironmentDefaults


class Lookup(TaskDefaults):
    """Prompt: a key; columns: the key, the symbol to answer with, the credit for a right lookup."""

    def __init__(self, num_symbols: int = 4, keys: int = 4, credit: float = 0.0, call_credit: float = 0.0):
        if not 0 <= call_credit <= credit < 1 and not (credit == 0 and call_credit == 0):
            raise ValueError(f"task.options: credit={credit}, call_credit={call_credit}: need 0 <= call_credit <= "
                             "credit < 1 (1 is a right answer's reward)")
        self.symbols = [chr(ord("a") + i) for i in range(num_symbols)]
        self.keys = [f"k{i + 1}" for i in range(keys)]
        self.credit, self.call_credit = credit, call_credit

    @classmethod
    def from_config(cls, cfg: TaskConfig) -> "Lookup":
        opts = dict(cfg.options)
        unknown = set(opts) - {"keys", "credit", "call_credit"}
        if unknown:
            raise ValueError(f"task.options: {sorted(unknown)} unknown to the lookup task; it takes keys, credit, "
                             "call_credit")
        return cls(cfg.num_symbols, int(opts.get("keys", 4)), float(opts.get("credit", 0.0)),
                   float(opts.get("call_credit", 0.0)))

    @staticmethod
    def levels(cfg: TaskConfig) -> list[float]:
        opts = dict(cfg.options)
        return sorted({0.0, float(opts.get("call_credit", 0.0)), float(opts.get("credit", 0.0)), 1.0})

    @property
    def reward_levels(self) -> list[float]:
        return sorted({0.0, self.call_credit, self.credit, 1.0})

    @property
    def vocabulary(self) -> list[str]:
        return ["lookup", "answer", *self.keys, *self.symbols]

    def sample(self, rng: random.Random) -> Prompt:
        table = {k: rng.choice(self.symbols) for k in self.keys}
        key = rng.choice(self.keys)
        return Prompt(id=f"lookup-{key}-{''.join(table.values())}", text=key,
                      columns={"key": key, "symbol": table[key], "table": table, "credit": self.credit,
                               "call_credit": self.call_credit})

    def eval_set(self, size: int | None, seed: int = 12345) -> list[Prompt]:
        if size is None:
            raise ValueError("eval.prompts=all: the lookup task has no eval file; give a number of prompts")
        return distinct(self.sample, size, seed)

    def score(self, prompt: Prompt, completion: str) -> float:
        """Single-turn: 1 when the completion answers the symbol (a guess: nothing shows it)."""
        return float(answer_of(completion) == prompt.columns["symbol"])


class LookupEnv(EnvironmentDefaults):
    """One episode: the asked key as the user's message; `lookup(key)`; reward on the first reply without a call."""

    def __init__(self, row: dict):
        self.key, self.symbol, self.table = row["key"], row["symbol"], row.get("table", {row["key"]: row["symbol"]})
        self.credit, self.call_credit = float(row.get("credit", 0.0)), float(row.get("call_credit", 0.0))
        self.called = self.found = False
        self.tools = [self.lookup] if self.with_tool else []

    with_tool = True

    def lookup(self, key: str) -> str:
        """Look a key up in the table and return its symbol.

        Args:
            key: The key to look up.
        """
        if key not in self.table:
            raise KeyError(f"no key {key}")
        self.called = True
        self.found = self.found or key == self.key
        return self.table[key]

    def reset(self) -> list[dict]:
        return [{"role": "user", "content": self.key}]

    def step(self, reply: str) -> tuple[list[dict], float | None, bool]:
        if answer_of(reply) == self.symbol:
            return [], 1.0, True
        return [], self.credit if self.found else self.call_credit if self.called else 0.0, True


def answer_of(reply: str) -> str | None:
    """The word after "answer" in a reply (`answer b` → b); None when the reply does not start with "answer"."""
    words = reply.split()
    return words[1] if len(words) > 1 and words[0] == "answer" else None


class LookupNoToolEnv(LookupEnv):
    """The same episode without the tool: the answer is a guess."""

    with_tool = False
