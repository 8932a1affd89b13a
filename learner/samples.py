"""The samples log: what the model wrote, as the learner trained on it (`log.samples_every`, `streamrl samples`).

Every `log.samples_every` steps the learner appends up to `log.samples_per_log` samples of the batch it is about to
train on to the run's samples.jsonl, one JSON object a line: whole groups, first in the batch first, so a group's
advantages can be read side by side. Texts are decoded from the tokens on the wire, so they are exactly what was
trained on (multi-turn episodes: the environment's turns included, marked by the chat template). A resumed learner
first cuts the file back to the steps before the checkpoint it resumed (the later ones are redone), the whole earlier
file moved aside (`samples.jsonl.before-resume-<step>-<time>`) as metrics.jsonl's is. The trackers (monitoring.
report_to) get each logged step's samples as a table.
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

FILE = "samples.jsonl"
log = logging.getLogger("streamrl.learner")


def records(groups: Sequence[ScoredGroup], step: int, version: int, cfg: Config, decode, limit: int) -> list[dict]:
    """Up to `limit` samples' records (whole groups, in batch order): prompt, completion, reward, advantage (the
    run's estimator over the group, as the step computes it), policy version, lag, finish reason, actor; and where
    they apply: whether it was scored, each reward function's value (`rewards_by_function`, by task.reward's
    references), an episode's turns and tool calls ('tool/outcome' → calls)."""
    a, out = cfg.advantage, []
    refs = [cfg.task.reward] if isinstance(cfg.task.reward, str) else list(cfg.task.reward or [])
    for g_index, group in enumerate(groups):
        if out and len(out) + group.group_size > limit:
            break
        adv = advantages.compute(torch.tensor([group.rewards], dtype=torch.float32), a.estimator, a.r_min_correct,
                                 a.std_normalize)[0].tolist()
        prompt = decode(group.prompt_tokens.tolist())
        for i, info in enumerate(group.samples[:limit - len(out)]):
            out.append({"step": step, "group": g_index, "prompt_id": group.prompt_id, "prompt": prompt,
                        "completion": decode(group.sample_tokens(i).tolist()), "reward": info.reward,
                        "advantage": adv[i], "policy_version": group.policy_version,
                        "lag": version - group.policy_version, "finish_reason": info.finish_reason,
                        "tokens": info.num_tokens, "actor": group.actor_id, "layer": group.layer,
                        "scored": info.scored, **_details(info, refs)})
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


def trim(path: Path, resumed_step: int) -> None:
    """Keep the records of the steps before `resumed_step` (a resumed learner redoes the later ones); the whole
    earlier file is first moved aside, never cut, so no record is destroyed."""
    if not path.exists():
        return
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    kept = [line for line in lines if json.loads(line)["step"] < resumed_step]
    if len(kept) == len(lines):
        return
    aside = path.with_name(f"{path.name}.before-resume-{resumed_step}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(path, aside)
    path.write_text("".join(line + "\n" for line in kept))
    log.warning("%s: steps %d and later are redone from the checkpoint; the earlier file is kept as %s", path.name,
                resumed_step, aside.name)


class SamplesLog:
    """Appends a step's samples to run_path/samples.jsonl when the step is due (`log.samples_every`; 0: never)."""

    def __init__(self, cfg: Config, tokenizer, run_path: Path, resumed_step: int = 0, trackers=None):
        """resumed_step: the step the learner starts at (its checkpoint's): later steps' records go; trackers: the
        run's (telemetry.trackers.Trackers), each given the logged samples as a table."""
        self.cfg, self.every, self.limit = cfg, cfg.log.samples_every, cfg.log.samples_per_log
        self.path = Path(run_path) / FILE
        self.decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
        self.trackers = trackers
        trim(self.path, resumed_step)

    def __call__(self, step: int, version: int, groups: Sequence[ScoredGroup]) -> None:
        if not self.every or step % self.every:
            return
        lines = records(groups, step, version, self.cfg, self.decode, self.limit)
        with open(self.path, "a") as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines))
        if self.trackers is not None and lines:
            self.trackers.samples(step, table(lines))
