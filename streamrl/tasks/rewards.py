"""Ordinal reward shaping: condense a task's fine reward scale onto a coarser one.

The paper maps a 10-step scale onto 4 steps. A task's level r (its ordinal scale on [0, 1]) lands
in bucket i = the number of edges ≤ r, and the shaped level is that bucket's value. A task may then
map the level to the reward it trains on (`to_reward`, monotone: the code verifier's -BCE = ln q);
tasks without one train on the level itself. `advantage.r_min_correct` is one of the resulting
levels (the config check refuses anything else), which is why a `Reward` knows its levels.
"""

from __future__ import annotations

from typing import Sequence

from streamrl.config import Config
from streamrl.ordinal import bucket, check_shaping, even_values, shaped_levels
from streamrl.tasks.base import optional


def nearest_level(value: float, levels: Sequence[float], tolerance: float) -> float | None:
    """The level nearest `value` when it is within `tolerance` of it (a reward written 0.33 is the level 1/3, and
    1/3 the level 0.33; never tighter than float rounding), else None."""
    near = min(levels, key=lambda lv: abs(lv - value))
    return near if abs(near - value) <= max(tolerance, 1e-9 * max(1.0, abs(near))) else None


class Reward:
    """task.score, then the configured bucketing, then the task's reward map (if any). Counts unparseable
    completions (the task says which)."""

    def __init__(self, task, edges: Sequence[float] = (), values: Sequence[float] = ()):
        check_shaping(edges, values)
        self.task = task
        self.edges = list(edges)
        self.values = list(values) or (even_values(len(edges) + 1) if edges else [])
        # A plug-in task may leave out any optional member (TaskDefaults): each is resolved here, once, so the
        # actor's loop calls what it finds without asking the task what it has.
        self.to_reward = optional(task, "to_reward")
        self._levels_for = optional(task, "levels_for")
        self._close = optional(task, "close")
        self.grouped: bool = bool(optional(task, "grouped"))
        self._submit, self._collect = optional(task, "submit_groups"), optional(task, "collect_groups")
        """The task scores a group per call (reward functions by reference) rather than a sample."""

    @property
    def levels(self) -> list[float]:
        """Every reward this can return, ascending."""
        # a continuous reward's levels are its buckets: the task needs the edges to name them
        return shaped_levels(self._levels_for(self.edges), self.edges, self.values, self.to_reward)

    @property
    def unparseable(self) -> int:
        """The task's counter, read as it is now (the task raises it while scoring; one without it never counts)."""
        return optional(self.task, "unparseable")

    def close(self) -> None:
        """The task's close (a dataset task's reward-function threads; nothing for most tasks)."""
        self._close()

    def __call__(self, prompt, completion: str) -> float:
        return self.shape(self.task.score(prompt, completion))

    def shape(self, r: float) -> float:
        return self.to_reward(bucket(r, self.edges, self.values) if self.edges else r)

    def score_groups(self, prompts, texts: list[list[str]], ids: list[list[list[int]]]):
        """Grouped tasks: (each group's shaped rewards, None where unscored; the failures by reason, summed)."""
        return self.collect_groups(self.submit_groups(prompts, texts, ids))

    def submit_groups(self, prompts, texts: list[list[str]], ids: list[list[list[int]]]):
        """Start scoring the groups on the task's pool; `collect_groups` waits for them."""
        return self._submit(prompts, texts, ids)

    def collect_groups(self, handle, parts: list | None = None):
        """(each group's shaped rewards, None where unscored; the failures by reason). parts: a list to extend with
        each group's per-sample values of each reward function (None for a task that does not say)."""
        from collections import Counter

        outcomes, failures = self._collect(handle), Counter()
        for o in outcomes:
            failures.update(o.failures)
        if parts is not None:
            parts.extend(getattr(o, "parts", None) for o in outcomes)
        return [[None if r is None else self.shape(r) for r in o.scores] for o in outcomes], failures


def build(cfg: Config) -> Reward:
    """The shaped reward of a run `Config`."""
    from streamrl import tasks

    references = [cfg.task.reward] if isinstance(cfg.task.reward, str) else cfg.task.reward or []
    if any(r.startswith("streamrl.tasks.graders:") for r in references):  # the rubric grader reads the run's section
        from streamrl.tasks import graders

        graders.configure(cfg.grader)
    return Reward(tasks.build(cfg.task), cfg.reward.bucket_edges, cfg.reward.bucket_values)
