"""The staleness rule: which groups the learner may still train on.

lag = learner_version_when_consumed - group.policy_version. A group with lag > max_staleness is
dropped (and counted); a group from a version the learner has not made yet is invalid. Strict
on-policy mode is max_staleness = 0, and the learner additionally fails loudly if a consumed group
ever has lag != 0. An actor keeps to the rule from its side with a `Throttle`: it makes no more
groups than the learner can still take within the bound.
"""

from __future__ import annotations

from typing import Literal

Verdict = Literal["ok", "stale", "future"]


def lag(learner_version, policy_version):
    """The one definition of lag; ints, or elementwise on tensors and arrays of policy versions."""
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
    An index beyond num_actors (an extra actor) makes none until the learner's Pace counts it in (`paced_share`)."""
    if index >= num_actors:
        return 0
    base, extra = divmod(batch_groups, num_actors)
    return max(1, base + (1 if index < extra else 0))


def paced_share(batch_groups: int, actors: list[str], actor_id: str) -> int:
    """An actor's planned share of each batch among the `actors` of a Pace (0: not one of them)."""
    return planned_share(batch_groups, len(actors), actors.index(actor_id)) if actor_id in actors else 0


def planned_actors(num_actors: int) -> list[str]:
    """The actors `actors.num` plans, in share order: what every throttle and the learner start from."""
    return [f"actor-{i}" for i in range(num_actors)]


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


SHARE_RELAX_VERSIONS = 50
"""Versions without a demand before a raised share returns to the planned one."""
UNLIMITED = 1 << 30
"""The budget of an actor that does not throttle (actors.throttle false): the learner drops what is too stale."""


class Throttle:
    """One actor's side of the staleness rule: its share of each batch, and how many groups it may
    still make before it must wait for newer weights (`generation_budget`), kept as the events
    that change them arrive.

    The share starts as the planned one (`planned_share`). A learner short of groups at a version
    (a Demand: fewer actors than planned) raises it; after `relax_after` versions without one it
    returns to the planned share (the missing actors are back, or others took over). The budget
    counts from `start_version`: the first weights, a restarted learner's first weights, or the
    last change of share (a new share must not apply to versions already past).

    The learner paces it (`pace`, a wire.Pace): `lead` versions ahead instead of max_staleness while its measured
    drift is over the bound, and a new planned share from a version on when the actors sharing a batch change
    (one joined). The learner takes exactly each actor's share of each batch, which is what lets the budget run
    to the bound with nothing arriving past it; a new share therefore keeps the groups already made ahead.
    """

    def __init__(self, batch_groups: int, num_actors: int, index: int, max_staleness: int, enabled: bool = True,
                 relax_after: int = SHARE_RELAX_VERSIONS):
        self.batch_groups, self.max_staleness, self.enabled, self.relax_after = (
            batch_groups, max_staleness, enabled, relax_after)
        # The batch split exactly (16 over 3 actors is 6, 5, 5; rounding every share up would make
        # surplus groups that go stale).
        self.share = self.base_share = planned_share(batch_groups, num_actors, index)
        self.actor_id = f"actor-{index}"
        self.lead = max_staleness
        """Versions ahead of the newest weights it may generate for (the learner's Pace; ≤ max_staleness)."""
        self.pending: tuple[int, int] | None = None
        """A paced (version, share) not yet reached."""
        self.version = self.start_version = self.produced = self.last_demand = 0
        self.total = 0
        """Groups made in this actor's life (`produced` counts from `start_version` only)."""
        self.life: int | None = None
        """The learner life (its restarts so far) the budget counts in; None before any weights."""

    def weights(self, version: int, life: int = 0) -> None:
        """The actor holds weights of `version` from the learner's `life` (restarts so far). A new
        life (a resumed learner, at a version of its own) starts the budget again."""
        if life != self.life:
            self.life, self.start_version, self.produced, self.pending = life, version, 0, None
        self.version = version
        self._reach_pending()

    def _reach_pending(self) -> None:
        if self.pending is not None and self.life is not None and self.version >= self.pending[0]:
            start, share = self.pending
            # The learner takes `share` a version from `start` on: groups made beyond the old share's versions
            # before it are still ahead of it, and count against the new budget.
            ahead = max(0, self.produced - (start - self.start_version) * self.share)
            self.share = self.base_share = share
            self.start_version, self.produced, self.pending = start, ahead, None

    def pace(self, version: int, lead: int, actors: list[str]) -> None:
        """The learner's Pace: generate at most `lead` versions ahead, and from `version` on, the share
        planned among `actors` (none if this actor is not one of them)."""
        self.lead = min(lead, self.max_staleness)
        share = paced_share(self.batch_groups, actors, self.actor_id)
        if share != (self.pending[1] if self.pending else self.base_share):
            self.pending = (version, share)
            self._reach_pending()

    def demand(self, groups_missing: int) -> None:
        """The learner lacks `groups_missing` groups at the current version: take them on, from now (none: this
        actor is not one the learner asked, the budget stays as it was)."""
        if groups_missing <= 0:
            return
        # What it made for the versions from now on stays made: only the missing groups are added to each (counting
        # from 0 would make its whole old share of this version again, surplus, stale in strict mode).
        left = generation_budget(self.version, self.start_version, self.produced, self.share, self.lead)
        made_ahead = (1 + self.lead) * self.share - left
        self.share = min(self.batch_groups, self.share + groups_missing)
        self.start_version, self.produced, self.last_demand = self.version, made_ahead, self.version

    def relax(self) -> bool:
        """Back to the planned share after `relax_after` versions without a demand; True if it changed."""
        if self.share > self.base_share and self.version - self.last_demand >= self.relax_after:
            self.share, self.start_version, self.produced = self.base_share, self.version, 0
            return True
        return False

    def made(self, groups: int) -> None:
        """`groups` more groups made (and handed to the sender) at the current weights."""
        self.produced += groups
        self.total += groups

    def budget(self) -> int:
        """Groups the actor may still make now; 0: wait for newer weights."""
        if not self.enabled:
            return UNLIMITED
        return generation_budget(self.version, self.start_version, self.produced, self.share, self.lead)
