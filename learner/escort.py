"""Multi-layer GRPO: a layer-2 group trains in the batch of the layer-1 group whose response it corrects.

An actor sends each layer-1 group right after the layer-2 groups of its responses' verified corrections (one message,
in order: actors/rollout.make_groups). So a layer-2 group waits here for the next layer-1 group of its actor's session
and then shares its fate: taken into the same batch, held with it for the next one, or dropped with it for the same
reason. Taken as they came, the layer-2 groups of a call whose layer-1 groups were split across batches (a demand
lifting the actors' shares, a share's boundary) trained in a batch without the groups they correct, and the step's
count of layer-2 groups stopped matching its verified corrections.
"""

from __future__ import annotations

from streamrl.algo import staleness
from streamrl.comm.codec import ScoredGroup


class Escort:
    """Layer-2 groups waiting for their layer-1 group, by (actor, session)."""

    def __init__(self) -> None:
        self.waiting: dict[tuple[str, str], list[ScoredGroup]] = {}

    def wait(self, group: ScoredGroup) -> None:
        self.waiting.setdefault((group.actor_id, group.session), []).append(group)

    def riders(self, group: ScoredGroup) -> list[ScoredGroup]:
        """The layer-2 groups that came just before `group`, a layer-1 group, from its session (in order)."""
        return self.waiting.pop((group.actor_id, group.session), [])

    def expire(self, version: int, max_staleness: int) -> list[ScoredGroup]:
        """Groups too old for any batch from `version` on: only an actor that broke the order above leaves any."""
        out = []
        for key, groups in list(self.waiting.items()):
            if staleness.gate(version, groups[-1].policy_version, max_staleness) == "stale":
                out += self.waiting.pop(key)
        return out

    def clear(self) -> int:
        """Forget every waiting group (the run stops or fails); returns how many."""
        n = len(self)
        self.waiting.clear()
        return n

    def __len__(self) -> int:
        return sum(map(len, self.waiting.values()))
