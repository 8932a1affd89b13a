"""Scored groups from a stale behaviour policy (importance weights far from 1), for the tests that train a real engine
on them (tests/unit/learner/test_minibatches.py, test_variance_control.py)."""

from __future__ import annotations

import random


def stale_groups(n: int, seed: int):
    """n ScoredGroups of 4 two-token samples each, rewards in [0, 1), behaviour log-probs in [-3, -0.5]."""
    from streamrl.comm.codec import ScoredGroup

    rng = random.Random(seed)
    return [ScoredGroup.from_samples(
        prompt_id=f"p{i}", policy_version=0, actor_id="a", prompt_tokens=[5, 6 + i % 3, 7],
        completions=[[8 + rng.randrange(4), 9 + rng.randrange(3)] for _ in range(4)],
        logprobs=[[-rng.uniform(0.5, 3.0), -rng.uniform(0.5, 3.0)] for _ in range(4)],
        rewards=[rng.random() for _ in range(4)], finish_reasons=["stop"] * 4) for i in range(n)]
