"""The samples log: what the model wrote, as the learner trained on it (`log.samples_every`, `streamrl samples`).

Every `log.samples_every` steps the learner appends up to `log.samples_per_log` samples of the batch it is about to
train on to the run's samples.jsonl, one JSON object a line: whole groups, first in the batch first, so a group's
advantages can be read side by side. Texts are decoded from the tokens on the wire, so they are exactly what was
trained on (multi-turn episodes: the environment's turns included, marked by the chat template).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch

from streamrl.algo import advantages
from streamrl.comm.codec import ScoredGroup
from streamrl.config import Config

FILE = "samples.jsonl"


def records(groups: Sequence[ScoredGroup], step: int, version: int, cfg: Config, decode, limit: int) -> list[dict]:
    """Up to `limit` samples' records (whole groups, in batch order): prompt, completion, reward, advantage (the
    run's estimator over the group, as the step computes it), policy version, lag, finish reason, actor."""
    a, out = cfg.advantage, []
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
                        "tokens": info.num_tokens, "actor": group.actor_id, "layer": group.layer})
    return out


class SamplesLog:
    """Appends a step's samples to run_path/samples.jsonl when the step is due (`log.samples_every`; 0: never)."""

    def __init__(self, cfg: Config, tokenizer, run_path: Path):
        self.cfg, self.every, self.limit = cfg, cfg.log.samples_every, cfg.log.samples_per_log
        self.path = Path(run_path) / FILE
        self.decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)

    def __call__(self, step: int, version: int, groups: Sequence[ScoredGroup]) -> None:
        if not self.every or step % self.every:
            return
        lines = records(groups, step, version, self.cfg, self.decode, self.limit)
        with open(self.path, "a") as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines))
