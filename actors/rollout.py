"""One rollout step: prompts → G completions each (more where dynamic rollouts ask) → rewards →
ScoredGroups stamped with the policy version that generated them, minus the filtered ones."""

from __future__ import annotations

import random

import msgspec

from actors.backends import Backend, Completion
from streamrl import group_filters
from streamrl.rewards import Reward
from streamrl.tasks import Prompt
from streamrl.wire import ScoredGroup


class RolloutStats(msgspec.Struct):
    """What one rollout step did besides making groups (the actor's metrics add these up)."""

    extra_samples: int = 0
    """Samples drawn beyond G by dynamic rollouts."""
    filtered_zero_variance: int = 0
    """Groups dropped because all their rewards were equal."""
    unparseable: int = 0
    """Completions the reward could not parse (scored lowest)."""


def sample_prompts(task, rng: random.Random, k: int) -> list[Prompt]:
    return [task.sample(rng) for _ in range(k)]


def make_groups(
    backend: Backend, tokenizer, reward: Reward, prompts: list[Prompt], group_size: int,
    policy_version: int, actor_id: str, *, r_min_correct: float, rollout_factor: int = 1,
    filter_zero_variance: bool = False,
) -> tuple[list[ScoredGroup], RolloutStats]:
    """rollout_factor > 1 turns on dynamic rollouts (up to rollout_factor × G samples per prompt)."""
    stats, unparseable_before = RolloutStats(), reward.unparseable
    prompt_ids = [tokenizer(p.text, add_special_tokens=False)["input_ids"] for p in prompts]
    pools: list[list[tuple[Completion, float]]] = [[] for _ in prompts]
    pending = list(range(len(prompts)))
    for round_ in range(rollout_factor):
        outputs = backend.generate([prompt_ids[i] for i in pending], group_size)
        for i, completions in zip(pending, outputs):
            texts = [tokenizer.decode(c.tokens, skip_special_tokens=True) for c in completions]
            pools[i] += [(c, reward(prompts[i], t)) for c, t in zip(completions, texts)]
        stats.extra_samples += group_size * len(pending) if round_ else 0
        pending = [i for i in pending if not group_filters.diverse([r for _, r in pools[i]], r_min_correct)]
        if not pending:
            break
    groups = []
    for prompt, ids, pool in zip(prompts, prompt_ids, pools):
        keep = group_filters.max_variance_subset([r for _, r in pool], group_size) if len(pool) > group_size \
            else range(group_size)
        chosen = [pool[i] for i in keep]
        if filter_zero_variance and group_filters.zero_variance([r for _, r in chosen]):
            stats.filtered_zero_variance += 1
            continue
        groups.append(ScoredGroup.from_samples(
            prompt_id=prompt.id,
            policy_version=policy_version,
            actor_id=actor_id,
            prompt_tokens=ids,
            completions=[c.tokens for c, _ in chosen],
            logprobs=[c.logprobs for c, _ in chosen],
            rewards=[r for _, r in chosen],
            finish_reasons=[c.finish_reason for c, _ in chosen],
        ))
    stats.unparseable = reward.unparseable - unparseable_before
    return groups, stats
