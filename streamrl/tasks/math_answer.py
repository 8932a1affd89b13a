"""A math task with a rule-based verifier (what multi-layer GRPO's paper trains on).

Data: JSONL rows `{"problem": ..., "answer": ...}` (e.g. GSM8K or MATH with the reference final
answer). The policy reasons and puts its final answer in `\\boxed{...}`; the reward is 1 when the
last boxed answer (or, without one, the last number) equals the reference, else 0. No answer at all
scores 0 and is counted as unparseable.

Equality is math-verify's (`math_verify.parse` / `verify`, the grader TRL and open-r1 use): both sides
are parsed as LaTeX/expressions into sympy and compared symbolically, so `\\frac{1}{2}` = 0.5,
`\\dfrac` = `\\frac`, `x=5` = 5, `1,250` = 1250. Where math-verify finds no expression on either
side (a name, yes/no), the answers are compared as normalised strings (`normalise`).
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import msgspec

from streamrl.config import TaskConfig
from streamrl.tasks import data
from streamrl.tasks.base import Prompt, RowsTask

TEMPLATE = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


class Problem(msgspec.Struct):
    problem: str
    answer: str


ROW = data.struct_row(Problem, "a row is problem, answer")


def read_jsonl(path: str | Path, max_row_bytes: int = data.MAX_ROW_BYTES) -> list[Problem]:
    """The usable rows of a data source (any format `streamrl.tasks.data` reads); bad rows are skipped and logged,
    a source without one usable row raises ValueError naming the file, row and problem."""
    return data.load(path, ROW, "problem, answer", max_row_bytes)


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...}, with nested braces balanced."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed{")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            if depth == 0:
                return text[i:j]
            depth -= 1
    return None


def normalise(answer: str) -> str:
    """Strip spaces, $, a trailing period and thousands separators; 2.50 and 2.5 compare equal."""
    a = answer.strip().strip("$").rstrip(".").replace(" ", "").replace(",", "")
    a = a.removeprefix("\\text{").removesuffix("}") if a.startswith("\\text{") else a
    try:
        return repr(float(a)) if "/" not in a else a
    except ValueError:
        return a


def same_answer(got: str, reference: str) -> bool:
    """`got` equals `reference` by math-verify, or as normalised strings where math-verify parses neither."""
    from math_verify import parse, verify  # sympy and an ANTLR parser: only the math task pays for them

    # math-verify's timeouts use signal.alarm, which only the main thread may set: a reward run in a worker
    # thread parses without one (its caller bounds the call).
    t = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse(f"\\boxed{{{reference}}}", parsing_timeout=t)
    pred = parse(f"\\boxed{{{got}}}", parsing_timeout=t)
    if gold and pred:
        return bool(verify(gold, pred, timeout_seconds=t))
    return normalise(got) == normalise(reference)


def final_answer(text: str) -> str | None:
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


class MathAnswer(RowsTask):
    """Binary reward: the final answer equals the reference."""

    def __init__(self, data: str | None, eval_data: str | None = None, template: str = TEMPLATE,
                 max_row_bytes: int = data.MAX_ROW_BYTES):
        if not data:
            raise ValueError("task math needs task.data: a JSONL file of {problem, answer} rows")
        self.train = read_jsonl(data, max_row_bytes)
        self.eval_rows = read_jsonl(eval_data, max_row_bytes) if eval_data else None
        self.template = template
        self.unparseable = 0

    @staticmethod
    def row_converter(cfg: TaskConfig):
        """The row check of a `TaskConfig` (what `streamrl check` reads the data files with)."""
        return ROW

    @classmethod
    def from_config(cls, cfg: TaskConfig) -> "MathAnswer":
        return cls(cfg.data, cfg.eval_data, cfg.template or TEMPLATE, cfg.max_row_bytes)

    def prompt(self, row: Problem) -> Prompt:
        from streamrl.tasks.verifier import hash_text

        return Prompt(id=f"math-{hash_text(row.problem):016x}", text=self.template.format(problem=row.problem),
                      target=(row.answer,))

    def score(self, prompt: Prompt, completion: str) -> float:
        got = final_answer(completion)
        if got is None:
            self.unparseable += 1
            return 0.0
        return 1.0 if same_answer(got, prompt.target[0]) else 0.0

    @staticmethod
    def levels(cfg: TaskConfig) -> list[float]:
        """The reward levels, from the `TaskConfig` alone."""
        return [0.0, 1.0]

    @property
    def reward_levels(self) -> list[float]:
        return [0.0, 1.0]

    @property
    def vocabulary(self) -> list[str]:
        words = self.template.split()
        for r in self.train + (self.eval_rows or []):
            words += f"{r.problem} {r.answer}".split()
        return list(dict.fromkeys(words))
