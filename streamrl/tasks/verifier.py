"""The paper's task: an explanatory pairwise code verifier, with an ordinal reward.

A prompt holds a question and two candidate responses (or, for a few samples, one). The policy
explains, then rates each response in [0, 10] ending with `A: <v_A> B: <v_B>` (single:
`Rating: <v>`). The ratings imply a verdict; q is the probability they give the labels' verdict:

- a pair whose labels differ: p = (1 + (v_B - v_A) / 10) / 2 is the implied chance that B is the
  better one, y = 1[label_b > label_a], q = p if y else 1 - p (first correct / second correct);
- a single response: p = v / 10, y = 1[label >= 0.5], q likewise;
- a pair whose labels tie (both correct, both incorrect): the labels prefer neither response but
  judge each, so each rating is a single judgement and q = sqrt(q_A q_B) (the pair's BCE is the
  mean of the two).

The BCE between the implied preference and the label is -ln q. q is computed exactly from the
decimal ratings (fractions, no float noise) and rounded onto `scale_steps` steps, half up by default
(`task.rounding`; the paper does not say): that is the task's ordinal scale on [0, 1], which
`reward.bucket_edges` may condense further. The trained reward is then `task.reward_form`: `bce` =
-BCE = ln q (the paper's form: <= 0; q is floored at `task.bce_floor`, 1e-3, so q = 0 trains on
ln 1e-3) or `exp` = exp(-BCE) = q. Unparseable output gets the lowest level and is counted.

Data: a JSONL file of `{question, response_a, response_b, label_a, label_b}` rows (`response_b`
and `label_b` left out for a single-response sample), or, with no file, a synthetic arithmetic
set made here so the task runs on the tiny CPU model.
"""

from __future__ import annotations

import math
import random
import re
from fractions import Fraction
from pathlib import Path

import msgspec

from streamrl.config import TaskConfig
from streamrl.tasks import data
from streamrl.tasks.base import Prompt, RowsTask

PAIR_TEMPLATE = ("Question: {question}\nResponse A: {response_a}\nResponse B: {response_b}\n"
                 "Explain which response is correct, then rate each from 0 to 10 as A: <rating> B: <rating>")
SINGLE_TEMPLATE = ("Question: {question}\nResponse: {response_a}\n"
                   "Explain whether the response is correct, then rate it from 0 to 10 as Rating: <rating>")
MAX_RATING = 10.0
EPS = 1e-3  # task.bce_floor's default: ln(max(q, EPS)), a confident wrong rating costs a finite BCE (ln 1e-3 = -6.9)
ROUNDINGS = ("half_up", "half_down")
FORMS = ("bce", "exp")
CATEGORIES = ("first_correct", "second_correct", "both_correct", "both_incorrect", "single")
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


ROW_HINT = "a row is question, response_a, label_a[, response_b, label_b]"
ROW = data.struct_row(Example, ROW_HINT)


def read_jsonl(path: str | Path, max_row_bytes: int = data.MAX_ROW_BYTES) -> list[Example]:
    """The usable rows of a data source (any format `streamrl.tasks.data` reads); bad rows are skipped and logged,
    a source without one usable row raises ValueError naming the file, row and problem."""
    return data.load(path, ROW, "question, response_a, label_a[, response_b, label_b]", max_row_bytes)


def category(labels: tuple[float, ...]) -> str:
    """The paper's table rows: first_correct, second_correct (labels differ), both_correct,
    both_incorrect (labels tie, at or above / below 0.5), single (one response)."""
    if len(labels) == 1:
        return "single"
    a, b = labels
    if a != b:
        return "first_correct" if a > b else "second_correct"
    return "both_correct" if a >= 0.5 else "both_incorrect"


def _single_q(v: Fraction, label: float) -> Fraction:
    p = v / 10
    return p if label >= 0.5 else 1 - p


def implied(ratings: tuple[Fraction, ...], labels: tuple[float, ...]) -> tuple[Fraction, bool]:
    """(Q, root): q = Q, or q = sqrt(Q) when root (a tie judged response by response). Exact."""
    if len(ratings) == 1:
        return _single_q(ratings[0], labels[0]), False
    if labels[0] == labels[1]:
        return _single_q(ratings[0], labels[0]) * _single_q(ratings[1], labels[1]), True
    p = (1 + (ratings[1] - ratings[0]) / 10) / 2
    return (p if labels[1] > labels[0] else 1 - p), False


def bce(ratings: tuple[float, ...], labels: tuple[float, ...]) -> float:
    """The BCE between the implied preference and the label, -ln q, before quantisation (inf for q = 0)."""
    q, root = implied(tuple(Fraction(str(v)) for v in ratings), labels)
    if q == 0:
        return math.inf
    return -math.log(q) / (2 if root else 1)


def quantise(q: Fraction, steps: int, root: bool = False, rounding: str = "half_up") -> Fraction:
    """q (or sqrt(q) when root) rounded to the nearest of 0, 1/steps, ..., 1, in integer arithmetic; a value
    exactly halfway goes up (half_up) or down (half_down)."""
    if not root:
        n = math.floor(q * steps + Fraction(1, 2))
        halfway = (2 * q * steps).denominator == 1 and (2 * q * steps) % 2 == 1
    else:
        # floor(sqrt(x) + 1/2) = (isqrt(floor(4x)) + 1) // 2 for x = q steps^2 >= 0
        x = q * steps * steps
        n = (math.isqrt(math.floor(4 * x)) + 1) // 2
        halfway = n > 0 and 4 * x == (2 * n - 1) ** 2   # sqrt(x) = n - 1/2 exactly
    return Fraction(n - 1 if halfway and rounding == "half_down" else n, steps)


def to_reward(level: float, form: str, floor: float = EPS) -> float:
    """The trained reward of a level q on [0, 1]: bce -> ln(max(q, floor)) = -BCE; exp -> q = exp(-BCE)."""
    return math.log(max(float(level), floor)) if form == "bce" else float(level)


def parse(text: str, pair: bool) -> tuple[Fraction, ...] | None:
    """The last rating statement in `text` as exact fractions, or None when there is none or a rating is
    outside [0, 10]."""
    found = (_PAIR if pair else _SINGLE).findall(text)
    if not found:
        return None
    last = found[-1] if pair else (found[-1],)
    ratings = tuple(Fraction(v) for v in last)
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


class CodeVerifier(RowsTask):
    """Pairwise (and a few single-response) judgements of code answers, rewarded by -BCE (or exp(-BCE)) on an
    ordinal scale."""

    def __init__(self, data: str | None = None, eval_data: str | None = None, scale_steps: int = 10,
                 single_fraction: float = 0.1, template: str = PAIR_TEMPLATE, single_template: str = SINGLE_TEMPLATE,
                 reward_form: str = "bce", bce_floor: float = EPS, rounding: str = "half_up",
                 max_row_bytes: int = data.MAX_ROW_BYTES):
        if reward_form not in FORMS:
            raise ValueError(f"reward_form={reward_form!r}: must be one of {', '.join(FORMS)}")
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding={rounding!r}: must be one of {', '.join(ROUNDINGS)}")
        self.bce_floor, self.rounding = bce_floor, rounding
        self.train = read_jsonl(data, max_row_bytes) if data else None
        self.eval_rows = read_jsonl(eval_data, max_row_bytes) if eval_data else None
        self.scale_steps = scale_steps
        self.single_fraction = single_fraction
        self.template, self.single_template = template, single_template
        self.reward_form = reward_form
        self.unparseable = 0

    @staticmethod
    def row_converter(cfg: TaskConfig):
        """The row check of a `TaskConfig` (what `streamrl check` reads the data files with)."""
        return ROW

    @classmethod
    def from_config(cls, cfg: TaskConfig) -> "CodeVerifier":
        return cls(cfg.data, cfg.eval_data, cfg.scale_steps, cfg.single_fraction,
                   cfg.template or PAIR_TEMPLATE, cfg.single_template or SINGLE_TEMPLATE, cfg.reward_form,
                   cfg.bce_floor, cfg.rounding, cfg.max_row_bytes)

    @staticmethod
    def levels(cfg: TaskConfig) -> list[float]:
        """The task's ordinal scale on [0, 1] from its `TaskConfig` alone (no data read): 0, 1/steps, ..., 1."""
        return [i / cfg.scale_steps for i in range(cfg.scale_steps + 1)]

    @staticmethod
    def reward_map(cfg: TaskConfig):
        """The map from a (shaped) level q to the trained reward under `cfg.reward_form`."""
        return lambda q: to_reward(q, cfg.reward_form, cfg.bce_floor)

    def to_reward(self, q: float) -> float:
        return to_reward(q, self.reward_form, self.bce_floor)

    def prompt(self, ex: Example) -> Prompt:
        pair = ex.response_b is not None
        text = (self.template.format(question=ex.question, response_a=ex.response_a, response_b=ex.response_b)
                if pair else self.single_template.format(question=ex.question, response_a=ex.response_a))
        labels = (ex.label_a, ex.label_b) if pair else (ex.label_a,)
        key = f"{ex.question}|{ex.response_a}|{ex.response_b}"
        return Prompt(id=f"verify-{abs(hash_text(key)):016x}", text=text, labels=labels)

    def category(self, prompt: Prompt) -> str:
        """The paper's table row of a prompt (see `category`)."""
        return category(prompt.labels)

    def sample(self, rng: random.Random) -> Prompt:
        if self.train is not None:
            return self.prompt(rng.choice(self.train))
        return self.prompt(synthetic(rng, single=rng.random() < self.single_fraction))

    def score(self, prompt: Prompt, completion: str) -> float:
        """The level q on [0, 1] (the ordinal scale shaping works on; the Reward then applies `to_reward`)."""
        ratings = parse(completion, pair=len(prompt.labels) == 2)
        if ratings is None:
            self.unparseable += 1
            return 0.0
        q, root = implied(ratings, prompt.labels)
        return float(quantise(q, self.scale_steps, root, self.rounding))

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
