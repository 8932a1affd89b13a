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
