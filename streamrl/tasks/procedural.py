"""reasoning-gym's procedural tasks (`task.name: reasoning_gym`, `task.dataset: <its name>`): nothing downloaded.

`reasoning_gym.create_dataset(task.dataset, size=, seed=, **task.options)` makes entries {question, answer,
metadata}; the policy sees the question (through `task.template`, field {question}), and the dataset's own
`score_answer(answer, entry)` gives partial credit in [0, 1] (e.g. spell_backward's similarity to the reversed
word). That credit is the ordinal level, floored onto `task.scale_steps` steps (0, 1/steps, ..., 1) so the scale is
declared before a run starts and only a fully right answer reaches 1. The answer is the text inside the last
<answer>...</answer> of the completion when it has one (reasoning-gym's convention for instruct models), else the
whole completion, stripped. reasoning-gym is an optional extra (`pip install 'streamrl[reasoning-gym]'`),
imported when the task is built.
"""

from __future__ import annotations

import logging
import math
import random
import re

from streamrl.config import TaskConfig
from streamrl.tasks.base import Prompt, TaskDefaults, distinct

log = logging.getLogger(__name__)

TEMPLATE = "{question}"
DEFAULT_SIZE = 1000
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def _library():
    try:
        import reasoning_gym
    except ImportError as e:
        raise ValueError("task reasoning_gym needs the reasoning-gym package: pip install 'streamrl[reasoning-gym]' "
                         f"({e})") from None
    return reasoning_gym


def dataset_names() -> list[str]:
    """Every dataset name reasoning-gym registers."""
    from reasoning_gym.factory import DATASETS

    _library()
    return sorted(DATASETS)


def extract_answer(completion: str) -> str:
    found = _ANSWER.findall(completion)
    return (found[-1] if found else completion).strip()


def floor_level(r: float, steps: int) -> float:
    """r in [0, 1] floored onto 0, 1/steps, ..., 1 (the epsilon keeps 0.3 * 10 from landing on 2)."""
    r = min(1.0, max(0.0, float(r))) if r is not None and math.isfinite(r) else 0.0
    return math.floor(r * steps + 1e-9) / steps


class ReasoningGym(TaskDefaults):  # registered by its entry point (pyproject.toml, group streamrl.tasks)
    """One reasoning-gym dataset; reward: its partial credit, floored onto scale_steps levels."""

    def __init__(self, dataset: str | None, options: dict | None = None, template: str = TEMPLATE,
                 scale_steps: int = 10):
        rg = _library()
        if not dataset:
            raise ValueError("task reasoning_gym needs task.dataset: one of " + ", ".join(dataset_names()))
        if dataset not in dataset_names():
            from streamrl.registry import Registry  # the same "did you mean" wording as every registry

            names = Registry("reasoning_gym dataset")
            for n in dataset_names():
                names.register(n)(n)
            raise ValueError(f"task.dataset={dataset!r}: {names.unknown(dataset)}")
        opts = dict(options or {})
        opts.setdefault("size", DEFAULT_SIZE)
        opts.setdefault("seed", 0)
        try:
            self.data = rg.create_dataset(dataset, **opts)
        except (TypeError, ValueError, AssertionError) as e:  # its config classes check options with asserts
            raise ValueError(f"task.options={options}: reasoning_gym {dataset!r} refused them: {e}") from None
        self.name, self.template, self.steps = dataset, template, scale_steps
        self.entries: dict[str, dict] = {}
        for entry in self.data:
            self.entries.setdefault(self._id(entry), entry)
        self.ids = list(self.entries)
        self.unparseable = 0  # score_answer raised on a completion (counted, scored 0)

    @classmethod
    def from_config(cls, cfg: TaskConfig) -> ReasoningGym:
        return cls(cfg.dataset, cfg.options, cfg.template or TEMPLATE, cfg.scale_steps)

    def _id(self, entry: dict) -> str:
        from streamrl.tasks.verifier import hash_text

        return f"rg-{self.name}-{hash_text(entry['question']):016x}"

    def prompt(self, pid: str) -> Prompt:
        entry = self.entries[pid]
        return Prompt(id=pid, text=self.template.format(question=entry["question"]), target=(str(entry["answer"]),))

    def sample(self, rng: random.Random) -> Prompt:
        return self.prompt(rng.choice(self.ids))

    def eval_set(self, size: int | None, seed: int = 12345) -> list[Prompt]:
        """`size` distinct questions of the dataset (None: all of them)."""
        if size is None:
            return [self.prompt(i) for i in self.ids]
        return distinct(self.sample, size, seed)

    def credit(self, prompt: Prompt, completion: str) -> float:
        """reasoning-gym's own partial credit in [0, 1] of the completion's answer (unfloored)."""
        entry = self.entries[prompt.id]
        try:
            r = self.data.score_answer(extract_answer(completion), entry)
        except Exception:  # a library scorer choking on odd text must not stop an actor
            self.unparseable += 1
            if self.unparseable == 1:
                log.exception("reasoning_gym %s: score_answer raised on %r (scored 0; counted as unparseable)",
                              self.name, completion[:200])
            return 0.0
        return float(r) if r is not None else 0.0

    def score(self, prompt: Prompt, completion: str) -> float:
        return floor_level(self.credit(prompt, completion), self.steps)

    @staticmethod
    def levels(cfg: TaskConfig) -> list[float]:
        return [i / cfg.scale_steps for i in range(cfg.scale_steps + 1)]

    @property
    def reward_levels(self) -> list[float]:
        return [i / self.steps for i in range(self.steps + 1)]

    @property
    def vocabulary(self) -> list[str]:
        """The tiny model's words: the template's, every question's and every answer's."""
        words = self.template.replace("{question}", " ").split()
        for e in self.entries.values():
            words += f"{e['question']} {e['answer']}".split()
        return list(dict.fromkeys(words))

    def sample_report(self) -> str:
        """A sample prompt and the score of the right answer and of a wrong one (for `streamrl check`)."""
        p = self.sample(random.Random(0))
        right = p.target[0]
        others = [str(e["answer"]) for e in self.entries.values() if str(e["answer"]) != right]
        wrong = others[0] if others else right[::-1] + "?"
        lines = [f"reasoning_gym {self.name}: {len(self.entries)} distinct questions; sample prompt:",
                 *("  " + line for line in p.text.splitlines()),
                 f"  right answer {right!r}: credit {self.credit(p, right):.3f}, level {self.score(p, right):.3f}",
                 f"  wrong answer {wrong!r}: credit {self.credit(p, wrong):.3f}, level {self.score(p, wrong):.3f}"]
        return "\n".join(lines)
