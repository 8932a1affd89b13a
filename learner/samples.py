"""The samples log: what the model wrote, as the learner trained on it (`log.samples_every`, `streamrl samples`).

Every `log.samples_every` steps the learner appends up to `log.samples_per_log` samples of the batch it is about to
train on to the run's samples.jsonl, one JSON object a line: whole groups, first in the batch first, so a group's
advantages can be read side by side. Texts are decoded from the tokens on the wire, so they are exactly what was
trained on (multi-turn episodes: the environment's turns included, marked by the chat template). An episode's record
also holds its `conversation`: each turn's role (model, environment, tool) and text, in order, decoded from the
completion's tokens by the turns the actor sent (streamrl.comm.turn_spans: roles and token counts, never texts). Each
record is bounded: a prompt or completion (observations included) longer than `log.samples_max_chars` keeps its
start and end around a marker "…[truncated, N chars]…", and the record its full length; an episode's turns share
that bound, a turn clipped so naming its full length (`truncated`). The file is rotated past
`log.samples_max_mb` into numbered parts, at most `log.samples_max_files` of them (streamrl.run.samples_files). A
resumed learner first cuts the log back to the steps before the checkpoint it resumed (the later ones are redone),
each part it cuts moved aside whole first (`samples.jsonl.before-resume-<step>-<time>`) as metrics.jsonl is. The
trackers (monitoring.report_to) get each logged step's samples as a table.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Sequence

import torch

from streamrl.algo import advantages
from streamrl.comm.codec import ScoredGroup
from streamrl.config import Config
from streamrl.registry import ESTIMATORS
from streamrl.run import samples_files
from streamrl.run.samples_files import FILE  # noqa: F401  (where the log is, for the learner's callers)
log = logging.getLogger("streamrl.learner")


def records(groups: Sequence[ScoredGroup], step: int, version: int, cfg: Config, decode, limit: int) -> list[dict]:
    """Up to `limit` samples' records (whole groups, in batch order): prompt, completion, reward, advantage (the
    run's estimator over the group, as the step computes it), policy version, lag, finish reason, actor; and where
    they apply: whether it was scored, each reward function's value (`rewards_by_function`, by task.reward's
    references), an episode's model turns, tool calls ('tool/outcome' → calls) and conversation (its turns in order,
    each {role, text} and a tool turn's `tools`)."""
    a, out = cfg.advantage, []
    refs = [cfg.task.reward] if isinstance(cfg.task.reward, str) else list(cfg.task.reward or [])
    for g_index, group in enumerate(groups):
        if out and len(out) + group.group_size > limit:
            break
        adv = advantages.compute(torch.tensor([group.rewards], dtype=torch.float32), a.estimator, a.r_min_correct,
                                 a.std_normalize, **a.options_dict(ESTIMATORS))[0].tolist()
        prompt = decode(group.prompt_tokens.tolist())
        for i, info in enumerate(group.samples[:limit - len(out)]):
            tokens = group.sample_tokens(i).tolist()
            out.append({"step": step, "group": g_index, "prompt_id": group.prompt_id, "prompt": prompt,
                        "completion": decode(tokens), "reward": info.reward,
                        "advantage": adv[i], "policy_version": group.policy_version,
                        "lag": version - group.policy_version, "finish_reason": info.finish_reason,
                        "tokens": info.num_tokens, "actor": group.actor_id, "layer": group.layer,
                        "scored": info.scored, **_details(info, refs), **_conversation(group, i, tokens, decode)})
    return out


COLUMNS = ["step", "group", "prompt", "completion", "reward", "advantage", "policy_version", "lag", "finish_reason",
           "scored", "details"]


def table(lines: list[dict]) -> tuple[list[str], list[list]]:
    """(columns, rows) of records for the trackers; `details` holds the rest of each record as JSON (each reward
    function's value, an episode's turns and tool calls, its actor and tokens)."""
    return COLUMNS, [[r.get(c) for c in COLUMNS[:-1]]
                     + [json.dumps({k: v for k, v in r.items() if k not in COLUMNS}, ensure_ascii=False)]
                     for r in lines]


def _details(info, refs: list[str]) -> dict:
    """What a sample says beyond its reward: each reward function's value, an episode's turns and tool calls."""
    out: dict = {}
    if info.parts is not None:
        names = refs if len(refs) == len(info.parts) else [f"function {i}" for i in range(len(info.parts))]
        out["rewards_by_function"] = dict(zip(names, info.parts))
    if info.turns is not None:
        out["turns"] = info.turns
        out["tool_calls"] = dict(info.tool_calls or {})
    return out


def _conversation(group: ScoredGroup, i: int, tokens: list[int], decode) -> dict:
    """Sample i's turns in order, each {"role", "text"} (a tool turn's "tools" too), its text decoded from its
    tokens of the completion; {} for a single-turn sample; `conversation_error` for turns that do not fit it."""
    try:
        spans = group.sample_turns(i)
    except ValueError as e:  # the actor's bug or a peer's lie: the record says so, the step trains on
        log.warning("samples log: %s sample %d of group %s: turns left out: %s", group.actor_id, i, group.prompt_id, e)
        return {"conversation_error": str(e)}
    if spans is None:
        return {}
    turns, at = [], 0
    for span in spans:
        turn = {"role": span.role, "text": decode(tokens[at:at + span.tokens])}
        turns.append({**turn, "tools": list(span.tools)} if span.role == "tool" else turn)
        at += span.tokens
    return {"conversation": turns}


def clip(text: str, limit: int) -> tuple[str, int | None]:
    """(text, None) when it has at most `limit` characters, else (its first ~3/4 and last ~1/4 of `limit` around a
    marker naming the full length, that length)."""
    if len(text) <= limit:
        return text, None
    tail = limit // 4
    return f"{text[:limit - tail]}…[truncated, {len(text)} chars]…{text[len(text) - tail:]}", len(text)


def bounded(record: dict, limit: int) -> dict:
    """The record with its prompt and completion clipped to `limit` characters; `truncated` names the full length
    of each one clipped."""
    out, cut = dict(record), {}
    for field in ("prompt", "completion"):
        out[field], full = clip(record[field], limit)
        if full is not None:
            cut[field] = full
    if turns := record.get("conversation"):  # the turns share the bound: each clipped to its share of it
        share = max(1, limit // len(turns)) if sum(len(t["text"]) for t in turns) > limit else limit
        out["conversation"] = [_clipped(t, share) for t in turns]
    return {**out, "truncated": cut} if cut else out


def _clipped(turn: dict, limit: int) -> dict:
    text, full = clip(turn["text"], limit)
    return turn if full is None else {**turn, "text": text, "truncated": full}


def trim(run_dir: Path, resumed_step: int) -> None:
    """Keep the records of the steps before `resumed_step` in every part of the log (a resumed learner redoes the
    later ones); each part that loses records is first moved aside whole, never cut, so no record is destroyed."""
    moved = []
    for path in samples_files.parts(run_dir):
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        kept = [line for line in lines if json.loads(line)["step"] < resumed_step]
        if len(kept) == len(lines):
            continue
        aside = path.with_name(f"{path.name}.before-resume-{resumed_step}-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(path, aside)
        if kept or path.name == FILE:
            path.write_text("".join(line + "\n" for line in kept))
        moved.append(aside.name)
    if moved:
        log.warning("samples log: steps %d and later are redone from the checkpoint; the earlier file%s kept as %s",
                    resumed_step, "s are" if len(moved) > 1 else " is", ", ".join(moved))


class SamplesLog:
    """Appends a step's samples to run_path/samples.jsonl when the step is due (`log.samples_every`; 0: never)."""

    def __init__(self, cfg: Config, tokenizer, run_path: Path, resumed_step: int = 0, trackers=None):
        """resumed_step: the step the learner starts at (its checkpoint's): later steps' records go; trackers: the
        run's (telemetry.trackers.Trackers), each given the logged samples as a table."""
        self.cfg, self.every, self.limit = cfg, cfg.log.samples_every, cfg.log.samples_per_log
        self.run_path = Path(run_path)
        self.path = self.run_path / FILE
        self.max_bytes = int(cfg.log.samples_max_mb * (1 << 20))
        self.full = False  # the log reached log.samples_max_files parts: nothing more is written
        self.decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
        self.trackers = trackers
        trim(self.run_path, resumed_step)

    def __call__(self, step: int, version: int, groups: Sequence[ScoredGroup]) -> None:
        if not self.every or step % self.every:
            return
        lines = [bounded(r, self.cfg.log.samples_max_chars)
                 for r in records(groups, step, version, self.cfg, self.decode, self.limit)]
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines).encode()
        if self._room_for(len(data), step):
            with open(self.path, "ab") as f:
                f.write(data)
        if self.trackers is not None and lines:
            self.trackers.samples(step, table(lines))

    def _room_for(self, nbytes: int, step: int) -> bool:
        """Whether `nbytes` more may be written: samples.jsonl is rotated first when they would take it past
        log.samples_max_mb, unless it already is the last part log.samples_max_files allows (then False, said once)."""
        if self.full:
            return False
        size = self.path.stat().st_size if self.path.exists() else 0
        if not size or size + nbytes <= self.max_bytes:
            return True
        if len(samples_files.parts(self.run_path)) >= self.cfg.log.samples_max_files:
            self.full = True
            log.warning("samples log: %d parts of up to %g MB written (log.samples_max_files, log.samples_max_mb); "
                        "no samples are logged from step %d on (raise either to keep more)",
                        self.cfg.log.samples_max_files, self.cfg.log.samples_max_mb, step)
            return False
        os.replace(self.path, samples_files.next_part(self.run_path))
        return True
