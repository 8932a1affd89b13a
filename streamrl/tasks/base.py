"""What every task shares: the `Task` protocol and the defaults of its optional members (`TaskDefaults`), the
`Prompt` a task makes, the task registry, and seeded distinct prompt sets.

A task makes prompts (`sample`, `eval_set`) and scores completions (`score`) with a reward in
[0, 1] on several levels (`reward_levels`); `streamrl.tasks.rewards` may condense those levels onto a
coarser ordinal scale, and a shaped reward at or above `advantage.r_min_correct` means "correct".
"""

from __future__ import annotations

import random
from typing import Any, Callable, ClassVar, Protocol, runtime_checkable

import msgspec

from streamrl.config import TaskConfig
from streamrl import registry


class Prompt(msgspec.Struct, frozen=True):
    id: str
    """Stable id: the same question gets the same id (difficulty filtering and pass@k group by it)."""
    text: str
    """What the policy sees."""
    target: tuple[str, ...] = ()
    """Symbol tasks: the words a fully correct completion starts with."""
    labels: tuple[float, ...] = ()
    """Verifier task: ground-truth quality of each candidate response (label_a[, label_b])."""
    messages: tuple[dict, ...] = ()
    """Chat prompts: the messages ({"role", "content"}, a system message allowed); `text` is their plain rendering."""
    columns: dict = {}
    """Dataset task: the row's other columns, passed to the reward functions as keyword lists."""
    where: str = ""
    """Dataset task: its row's file and line, where known (what a bad row is named by)."""


TASKS = registry.TASKS


@runtime_checkable
class Task(Protocol):
    """What a task must have (docs/guides/bring-your-own-task.md). The optional members (grouped, submit_groups,
    collect_groups, levels_take_edges, unparseable, category, row_converter, sample_report, agent_fn,
    reward_map, to_reward, levels_for, environment_class, close) and their defaults are `TaskDefaults`'; a plug-in
    may inherit it or not (`optional` fills in what it lacks). Nothing asks a task whether it has a member:
    `optional` reads each once."""

    @classmethod
    def from_config(cls, cfg: TaskConfig) -> Task:
        """The task, from the `task` config section."""

    @staticmethod
    def levels(cfg: TaskConfig) -> list[float]:
        """Its reward levels, ascending, from the config alone (the config checks r_min_correct against them)."""

    @property
    def reward_levels(self) -> list[float]:
        """The same levels, from the built task."""

    def sample(self, rng: random.Random) -> Prompt:
        """A training prompt."""

    def eval_set(self, size: int | None, seed: int = 12345) -> list[Prompt]:
        """A fixed evaluation set: `size` prompts (None: every row of an eval file), the same for the same seed."""

    def score(self, prompt: Prompt, completion: str) -> float:
        """The reward of a completion, one of `reward_levels`."""

    @property
    def vocabulary(self) -> list[str]:
        """The words the tiny word-level model needs for this task's prompts and answers."""


def _identity(x: float) -> float:
    return x


class TaskDefaults:
    """The optional members of a task, with what a task without them means. streamrl's own tasks inherit
    this; a plug-in may too, or leave any out (`optional` then gives the default here)."""

    grouped: ClassVar[bool] = False
    """Scored a group per call (`submit_groups`, `collect_groups`) instead of a sample per `score`."""
    levels_take_edges: ClassVar[bool] = False
    """`levels(cfg, edges)` takes reward.bucket_edges: a continuous reward whose levels are its buckets."""
    unparseable: int = 0
    """Completions the task could not read so far (a counter it raises; the default never counts)."""
    category: Callable[[Prompt], str] | None = None
    """category(prompt): the eval report's row of a prompt (pass@k per category); None: one row."""
    row_converter: Callable[[Any], Callable[[Any], Any]] | None = None
    """row_converter(task_cfg) → convert(row): a task reading `task.data` (a staticmethod; `streamrl check` and the
    epoch count read the files through it); None: the task reads no data file."""
    sample_report: Callable[[], str] | None = None
    """sample_report(): a sample prompt with a right and a wrong answer's scores (`streamrl check` prints it)."""
    agent_fn: Callable[[Any, dict], Any] | None = None
    """An agent task's (capability `agent_rollout`): fn(client, row) plays one episode through the actor's endpoint and returns its reward."""

    def submit_groups(self, prompts: list[Prompt], texts: list[list[str]], ids: list[list[list[int]]]) -> Any:
        """grouped: start scoring each group's completions (texts[g][i], their token ids ids[g][i]); returns a
        handle for `collect_groups`."""
        raise ValueError(f"task {type(self).__name__}: grouped, so it needs submit_groups and collect_groups")

    def collect_groups(self, handle) -> list:
        """grouped: each group's outcome (`scores`, None where unscored; `failures` by reason; optional `parts`)."""
        raise ValueError(f"task {type(self).__name__}: grouped, so it needs submit_groups and collect_groups")

    def environment_class(self) -> type | None:
        """An episodic task's (capability `episodes`): the `Environment` class each episode is built from, `Cls(row)` (an adapter's);
        None: task.environment's."""
        return None

    @staticmethod
    def reward_map(cfg: TaskConfig) -> Callable[[float], float]:
        """From the config alone: the map from a shaped level to the reward trained on (monotone)."""
        return _identity

    def to_reward(self, level: float) -> float:
        """The reward trained on for a shaped level (the built task's `reward_map`)."""
        return level

    def levels_for(self, edges) -> list[float]:
        """The task's levels given reward.bucket_edges (a continuous reward's are its buckets)."""
        return self.reward_levels  # type: ignore[attr-defined]  # the Task member the subclass gives

    def close(self) -> None:
        """Let go of what the task holds (threads, connections); it scores nothing after."""


def optional(task: Any, name: str) -> Any:
    """A task's (or task class's) optional member `name`, or `TaskDefaults`' for one that lacks it (bound to
    the task where it is a method). Read once where a task is built, never per call."""
    return TASKS.member(task, name)


def render(messages) -> str:
    """Chat messages as plain text, for a model without a chat template (the tiny word-level one): each
    message's content on its own line, system first, so the words the policy sees are the messages' words."""
    return "\n".join(m["content"] for m in messages)


def distinct(sample: Callable[[random.Random], Prompt], size: int, seed: int) -> list[Prompt]:
    """`size` prompts with distinct ids drawn from `sample` on a stream seeded with `seed` (fewer where the space
    is smaller)."""
    rng, seen, out = random.Random(seed), set(), []
    for _ in range(size * 20):
        p = sample(rng)
        if p.id not in seen:
            seen.add(p.id)
            out.append(p)
            if len(out) == size:
                break
    return out


def build(cfg: TaskConfig):
    """The task a `TaskConfig` names (every task class has `from_config`)."""
    return TASKS.get(cfg.name).from_config(cfg)


class RowsTask(TaskDefaults):
    """A task over data rows: `train` (rows), `eval_rows` (None without an eval file) and `prompt(row)`."""

    train: list
    eval_rows: list | None

    def prompt(self, row) -> Prompt:
        raise NotImplementedError

    def sample(self, rng: random.Random) -> Prompt:
        return self.prompt(rng.choice(self.train))

    def eval_set(self, size: int | None, seed: int = 12345) -> list[Prompt]:
        """The first `size` rows of the eval file (None: every row), else `size` distinct prompts from `sample`."""
        if self.eval_rows is not None:
            return [self.prompt(r) for r in self.eval_rows[:size]]
        if size is None:
            raise ValueError("eval.prompts=all: needs task.eval_data (only a file has a fixed size); "
                             "give a number of prompts")
        return distinct(self.sample, size, seed)
