"""Any dataset with reward functions by reference: `task.name: dataset`.

Rows come from `task.data` / `task.eval_data` through `streamrl.tasks.data` (JSONL, JSON, Parquet, a
save_to_disk folder, a hub id). `task.prompt_field` (default `prompt`) holds a string or a list of chat
messages (`{"role": "system" | "user" | "assistant", "content": str}`, a system message allowed, the last one
a user turn); every other column goes to the reward functions (`streamrl.tasks.reward_functions`, TRL's
signature, one call per group). The reward scale is `task.reward_levels` (a reward off it is counted and
unscored) or, for a continuous reward, the buckets of `reward.bucket_edges`.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from streamrl.config import TaskConfig
from streamrl.tasks import data
from streamrl.tasks.base import Prompt, RowsTask, render
from streamrl.tasks.reward_functions import Call, Outcome, RewardFunctions

ROLES = ("system", "user", "assistant")


class Row(msgspec.Struct, frozen=True):
    prompt: str | tuple[dict, ...]
    columns: dict
    where: str = ""
    """Its file and line ("data/train.jsonl:17"), where known: what a bad row is named by."""


def located(source, convert, what: str, max_row_bytes: int) -> list[Row]:
    """The usable rows of `source` (data.load), each with its file and line."""
    rows = data.load_rows(source, convert, what, max_row_bytes)
    return [msgspec.structs.replace(r, where=f"{rows.source}:{n}") for n, r in zip(rows.numbers, rows.items)]


def converter(prompt_field: str):
    """A row object → Row; ValueError names the field and what is allowed."""

    def convert(row: Any) -> Row:
        if not isinstance(row, dict):
            raise ValueError(f"a row is an object with a {prompt_field!r} field, got {type(row).__name__}")
        if prompt_field not in row:
            raise ValueError(f"no {prompt_field!r} field (task.prompt_field); the row has {sorted(row)}")
        value = row[prompt_field]
        columns = {k: v for k, v in row.items() if k != prompt_field}
        if isinstance(value, str):
            if not value.strip():
                raise ValueError(f"{prompt_field!r} is empty")
            return Row(value, columns)
        if not isinstance(value, list) or not value:
            raise ValueError(f"{prompt_field!r} must be a string or a non-empty list of messages, "
                             f"got {type(value).__name__}")
        messages = []
        for i, m in enumerate(value):
            if not isinstance(m, dict) or set(m) - {"role", "content"} or not isinstance(m.get("content"), str):
                raise ValueError(f"{prompt_field}[{i}]: a message is {{'role': ..., 'content': str}}, got {m!r:.80}")
            if m.get("role") not in ROLES:
                raise ValueError(f"{prompt_field}[{i}]: role {m.get('role')!r}; allowed: {', '.join(ROLES)}")
            if m["role"] == "system" and i:
                raise ValueError(f"{prompt_field}[{i}]: a system message comes first")
            messages.append({"role": m["role"], "content": m["content"]})
        if messages[-1]["role"] != "user":
            raise ValueError(f"{prompt_field}: the last message is {messages[-1]['role']!r}; it must be a user turn")
        return Row(tuple(messages), columns)

    return convert


class DatasetTask(RowsTask):
    """Prompts from a dataset; rewards from functions in TRL's signature (a group per call)."""

    grouped = True  # scored a group at a time (score_groups); `score` is the one-sample path (evaluation)

    def __init__(self, cfg: TaskConfig):
        self._rows(cfg, "task dataset")
        if not cfg.reward and not cfg.environment:  # an environment's episodes carry their own reward
            raise ValueError("task dataset needs task.reward: 'package.module:function' or 'file.py:function'")
        refs = [cfg.reward] if isinstance(cfg.reward, str) else list(cfg.reward or [])
        self.functions = RewardFunctions(refs, cfg.reward_weights or None, cfg.reward_levels or None,
                                         cfg.reward_timeout_s, cfg.reward_workers, cfg.reward_fail_window,
                                         cfg.reward_fail_threshold, cfg.reward_level_tolerance)

    def close(self) -> None:
        """The reward functions' threads go (a call past its timeout may still run on one)."""
        self.functions.close()

    def _rows(self, cfg: TaskConfig, rows_from: str) -> None:
        """This task's rows from task.data (and task.eval_data) and what every dataset task keeps beside them;
        rows_from: who needs them, for the error when task.data is missing."""
        if not cfg.data:
            raise ValueError(f"{rows_from} needs task.data: " + data.FORMATS)
        convert = converter(cfg.prompt_field)
        what = f"an object with {cfg.prompt_field!r} (a string or chat messages) and any other columns"
        self._keep(cfg, located(cfg.data, convert, what, cfg.max_row_bytes),
                   located(cfg.eval_data, convert, what, cfg.max_row_bytes) if cfg.eval_data else None)

    def _keep(self, cfg: TaskConfig, train: list[Row], eval_rows: list[Row] | None) -> None:
        """The task's rows, and what every dataset task keeps beside them."""
        self.train, self.eval_rows = train, eval_rows
        self.cfg, self._declared, self._levels = cfg, bool(cfg.reward_levels), self.levels(cfg, ())
        self.extra_words = list(cfg.vocabulary)
        self.unparseable = 0

    @staticmethod
    def row_converter(cfg: TaskConfig):
        """The row check of a `TaskConfig` (what `streamrl check` reads the data files with)."""
        return converter(cfg.prompt_field)

    @classmethod
    def from_config(cls, cfg: TaskConfig) -> "DatasetTask":
        return cls(cfg)

    @staticmethod
    def levels(cfg: TaskConfig, edges=()) -> list[float]:
        """The declared levels; a continuous reward (no levels) is represented by one value per bucket."""
        if cfg.reward_levels:
            return sorted(cfg.reward_levels)
        if edges:
            return [edges[0] - 1.0, *edges]
        return [0.0, 1.0]  # only for a bare name check; the config refuses a dataset task with neither

    levels_take_edges = True  # streamrl.tasks.rewards.levels_of passes reward.bucket_edges

    @property
    def reward_levels(self) -> list[float]:
        return self._levels

    def levels_for(self, edges) -> list[float]:
        """The task's levels under reward.bucket_edges `edges` (streamrl.tasks.rewards.Reward.levels)."""
        return self._levels if self._declared else self.levels(self.cfg, edges)

    def prompt(self, row: Row) -> Prompt:
        from streamrl.tasks.verifier import hash_text

        chat = not isinstance(row.prompt, str)
        text = render(row.prompt) if chat else row.prompt
        key = json.dumps([row.prompt, row.columns], sort_keys=True, default=str)
        return Prompt(id=f"data-{hash_text(key):016x}", text=text, messages=row.prompt if chat else (),
                      columns=row.columns, where=row.where)

    @staticmethod
    def call(prompt: Prompt, texts: list[str], ids: list[list[int]]) -> Call:
        """TRL's shapes: chat prompts go as their messages, completions then as one assistant message each."""
        if prompt.messages:
            return Call(list(prompt.messages), [[{"role": "assistant", "content": t}] for t in texts], ids,
                        prompt.columns)
        return Call(prompt.text, texts, ids, prompt.columns)

    def score_groups(self, prompts: list[Prompt], texts: list[list[str]], ids: list[list[list[int]]]) -> list[Outcome]:
        return self.collect_groups(self.submit_groups(prompts, texts, ids))

    def submit_groups(self, prompts: list[Prompt], texts: list[list[str]], ids: list[list[list[int]]]):
        """Start every group's call on the pool; `collect_groups` waits for them (generation may go on meanwhile)."""
        return self.functions.submit([self.call(p, t, i) for p, t, i in zip(prompts, texts, ids)])

    def collect_groups(self, handle) -> list[Outcome]:
        return self.functions.collect(handle)

    def score(self, prompt: Prompt, completion: str) -> float:
        """One sample (evaluation): an unscored sample counts as the lowest level."""
        got = self.score_groups([prompt], [[completion]], [[[]]])[0].scores[0]
        if got is None:
            self.unparseable += 1
            return self._levels[0]
        return got

    @property
    def vocabulary(self) -> list[str]:
        """Words of the prompts and of the columns' text (the tiny word-level model's vocabulary)."""
        words = list(self.extra_words)
        for r in self.train + (self.eval_rows or []):
            words += (r.prompt if isinstance(r.prompt, str) else render(r.prompt)).split()
            for v in r.columns.values():
                if isinstance(v, (str, int, float)) and not isinstance(v, bool):
                    words += str(v).split()
        return list(dict.fromkeys(words))
