"""The staleness rule: which groups the learner may still train on.

lag = learner_version_when_consumed - group.policy_version. A group with lag > max_staleness is
dropped (and counted); a group from a version the learner has not made yet is invalid. Strict
on-policy mode is max_staleness = 0, and the learner additionally fails loudly if a consumed group
ever has lag != 0.
"""

from __future__ import annotations

from typing import Literal

Verdict = Literal["ok", "stale", "future"]


def lag(learner_version: int, policy_version: int) -> int:
    return learner_version - policy_version


def gate(learner_version: int, policy_version: int, max_staleness: int) -> Verdict:
    """'ok' to train on, 'stale' to drop, 'future' for a version the learner never published."""
    d = lag(learner_version, policy_version)
    if d < 0:
        return "future"
    if d > max_staleness:
        return "stale"
    return "ok"


def planned_share(batch_groups: int, num_actors: int, index: int) -> int:
    """Groups per learner version actor `index` makes so that all actors together make one batch.
    An index beyond num_actors (an extra actor) gets the largest share."""
    num = max(num_actors, 1)
    base, extra = divmod(batch_groups, num)
    return max(1, base + (1 if index % num < extra or index >= num else 0))


def generation_budget(known_version: int, start_version: int, produced: int, share: int, max_staleness: int) -> int:
    """Groups an actor may still generate before it must wait for newer weights.

    The learner consumes about `share` groups per version from each actor, so an actor that has
    seen `known_version` may have made at most (versions seen + max_staleness) × share groups since
    it started at `start_version`. Anything beyond that would arrive too stale to train on (the
    per-actor form of AReaL's staleness-aware capacity). max_staleness 0 is strict on-policy: one
    share per version, then wait.
    """
    allowed = (known_version - start_version + 1 + max_staleness) * share
    return max(0, allowed - produced)
