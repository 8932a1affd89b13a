"""The paper's task: an explanatory pairwise code verifier, with an ordinal reward.

A prompt holds a question and two candidate responses (or, for a few samples, one). The policy
explains, then rates each response in [0, 10] ending with `A: <v_A> B: <v_B>` (single:
`Rating: <v>`). The reward is the negated binary cross-entropy between the normalised rating
difference p = (1 + (v_B - v_A) / 10) / 2 and the label y = 1[label_b > label_a]; it is reported
on [0, 1] as exp(-BCE) (the probability the ratings give the true label, monotone in -BCE) and
quantised to `scale_steps` steps. Unparseable output gets the lowest reward and is counted.

Data: a JSONL file of `{question, response_a, response_b, label_a, label_b}` rows (`response_b`
and `label_b` left out for a single-response sample), or, with no file, a synthetic arithmetic
set made here so the task runs on the tiny CPU model.
"""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

import msgspec

from streamrl.tasks.base import TASKS, Prompt, distinct

PAIR_TEMPLATE = ("Question: {question}\nResponse A: {response_a}\nResponse B: {response_b}\n"
                 "Explain which response is correct, then rate each from 0 to 10 as A: <rating> B: <rating>")
SINGLE_TEMPLATE = ("Question: {question}\nResponse: {response_a}\n"
                   "Explain whether the response is correct, then rate it from 0 to 10 as Rating: <rating>")
MAX_RATING = 10.0
_EPS = 1e-3  # p is clamped to [eps, 1 - eps] so a confident wrong rating costs a finite BCE
_NUM = r"(-?\d+(?:\.\d+)?)"
_PAIR = re.compile(rf"A:\s*{_NUM}\s*,?\s*B:\s*{_NUM}")
_SINGLE = re.compile(rf"Rating:\s*{_NUM}")


class Example(msgspec.Struct, forbid_unknown_fields=False):
    """One JSONL row. A row without response_b is a single-response judgement sample."""

    question: str
    response_a: str
    label_a: float
    response_b: str | None = None
    label_b: float | None = None

    def __post_init__(self) -> None:
        if (self.response_b is None) != (self.label_b is None):
            raise ValueError("response_b and label_b come together (both, or neither for a single-response sample)")
        for name in ("label_a", "label_b"):
            v = getattr(self, name)
            if v is not None and not math.isfinite(v):
                raise ValueError(f"{name}={v}: must be a finite number")


def read_jsonl(path: str | Path) -> list[Example]:
    """Every row of a JSONL file; a bad row raises ValueError naming the file, line and problem."""
    rows, decoder = [], msgspec.json.Decoder(Example)
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(decoder.decode(line))
            except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as e:
                raise ValueError(f"{path}:{n}: {e} (a row is question, response_a, label_a[, response_b, label_b])")
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def bce_reward(ratings: tuple[float, ...], labels: tuple[float, ...]) -> float:
    """exp(-BCE) in (0, 1): pair ratings (v_A, v_B) with labels (label_a, label_b), or a single (v,) with (label,).

    Pair: p = (1 + (v_B - v_A) / 10) / 2, y = 1[label_b > label_a]. Single: p = v / 10, y = 1[label ≥ 0.5].
    """
    if len(ratings) == 2:
        p = (1 + (ratings[1] - ratings[0]) / MAX_RATING) / 2
        y = 1.0 if labels[1] > labels[0] else 0.0
    else:
        p, y = ratings[0] / MAX_RATING, 1.0 if labels[0] >= 0.5 else 0.0
    p = min(max(p, _EPS), 1 - _EPS)
    bce = -(y * math.log(p) + (1 - y) * math.log(1 - p))
    return math.exp(-bce)


def quantise(x: float, steps: int) -> float:
    """x in [0, 1] rounded (half up) to the nearest of 0, 1/steps, ..., 1."""
    return math.floor(x * steps + 0.5) / steps


def parse(text: str, pair: bool) -> tuple[float, ...] | None:
    """The last rating statement in `text`, or None when there is none or a rating is outside [0, 10]."""
    found = (_PAIR if pair else _SINGLE).findall(text)
    if not found:
        return None
    last = found[-1] if pair else (found[-1],)
    ratings = tuple(float(v) for v in last)
    return ratings if all(0 <= v <= MAX_RATING for v in ratings) else None


def synthetic(rng: random.Random, single: bool) -> Example:
    """An arithmetic question with one right and one off-by-some answer, in random order."""
    x, y = rng.randrange(10), rng.randrange(10)
    right, wrong = x + y, x + y + rng.choice([-2, -1, 1, 2])
    question = f"sum {x} {y}"
    if single:
        ok = rng.random() < 0.5
        return Example(question=question, response_a=str(right if ok else wrong), label_a=float(ok))
    if rng.random() < 0.5:
        return Example(question=question, response_a=str(right), label_a=1.0, response_b=str(wrong), label_b=0.0)
    return Example(question=question, response_a=str(wrong), label_a=0.0, response_b=str(right), label_b=1.0)


@TASKS.register("code_verifier")
class CodeVerifier:
    """Pairwise (and a few single-response) judgements of code answers, scored by exp(-BCE) on an ordinal scale."""

    def __init__(self, data: str | None = None, eval_data: str | None = None, scale_steps: int = 10,
                 single_fraction: float = 0.1, template: str = PAIR_TEMPLATE, single_template: str = SINGLE_TEMPLATE):
        self.train = read_jsonl(data) if data else None
        self.eval_rows = read_jsonl(eval_data) if eval_data else None
        self.scale_steps = scale_steps
        self.single_fraction = single_fraction
        self.template, self.single_template = template, single_template
        self.unparseable = 0

    @classmethod
    def from_config(cls, cfg) -> "CodeVerifier":
        return cls(cfg.data, cfg.eval_data, cfg.scale_steps, cfg.single_fraction,
                   cfg.template or PAIR_TEMPLATE, cfg.single_template or SINGLE_TEMPLATE)

    def prompt(self, ex: Example) -> Prompt:
        pair = ex.response_b is not None
        text = (self.template.format(question=ex.question, response_a=ex.response_a, response_b=ex.response_b)
                if pair else self.single_template.format(question=ex.question, response_a=ex.response_a))
        labels = (ex.label_a, ex.label_b) if pair else (ex.label_a,)
        key = f"{ex.question}|{ex.response_a}|{ex.response_b}"
        return Prompt(id=f"verify-{abs(hash_text(key)):016x}", text=text, labels=labels)

    def sample(self, rng: random.Random) -> Prompt:
        if self.train is not None:
            return self.prompt(rng.choice(self.train))
        return self.prompt(synthetic(rng, single=rng.random() < self.single_fraction))

    def eval_set(self, size: int, seed: int = 12345) -> list[Prompt]:
        if self.eval_rows is not None:
            return [self.prompt(ex) for ex in self.eval_rows[:size]]
        return distinct(self.sample, size, seed)

    def score(self, prompt: Prompt, completion: str) -> float:
        ratings = parse(completion, pair=len(prompt.labels) == 2)
        if ratings is None:
            self.unparseable += 1
            return 0.0
        return quantise(bce_reward(ratings, prompt.labels), self.scale_steps)

    @property
    def reward_levels(self) -> list[float]:
        return [i / self.scale_steps for i in range(self.scale_steps + 1)]

    @property
    def vocabulary(self) -> list[str]:
        """Every word of the templates, the data and the rating format (the tiny model's tokenizer)."""
        rows = (self.train or []) + (self.eval_rows or [])
        words = [*self.template.split(), *self.single_template.split(), "A:", "B:", "Rating:",
                 *(str(i) for i in range(-2, 21)), "sum", "right", "wrong", "is", "because"]
        for ex in rows:
            words += f"{ex.question} {ex.response_a} {ex.response_b or ''}".split()
        return list(dict.fromkeys(words))


def hash_text(text: str) -> int:
    """A stable 64-bit hash (Python's hash() is salted per process; prompt ids must match across actors)."""
    import hashlib

    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
