"""One rollout step: prompts → G completions each → rewards → ScoredGroups stamped with the
policy version that generated them."""

from __future__ import annotations

import random

from actors.backends import Backend
from streamrl.rewards import Reward
from streamrl.tasks import Prompt
from streamrl.wire import ScoredGroup


def sample_prompts(task, rng: random.Random, k: int) -> list[Prompt]:
    return [task.sample(rng) for _ in range(k)]


def make_groups(
    backend: Backend, tokenizer, reward: Reward, prompts: list[Prompt], group_size: int,
    policy_version: int, actor_id: str,
) -> list[ScoredGroup]:
    prompt_ids = [tokenizer(p.text, add_special_tokens=False)["input_ids"] for p in prompts]
    outputs = backend.generate(prompt_ids, group_size)
    groups = []
    for prompt, ids, completions in zip(prompts, prompt_ids, outputs):
        texts = [tokenizer.decode(c.tokens, skip_special_tokens=True) for c in completions]
        groups.append(ScoredGroup.from_samples(
            prompt_id=prompt.id,
            policy_version=policy_version,
            actor_id=actor_id,
            prompt_tokens=ids,
            completions=[c.tokens for c in completions],
            logprobs=[c.logprobs for c in completions],
            rewards=[reward(prompt, t) for t in texts],
            finish_reasons=[c.finish_reason for c in completions],
        ))
    return groups
