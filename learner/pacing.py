"""The learner's side of pacing: how many of each actor's groups a batch takes, which actors share it, and how far
ahead they may generate while the measured drift is over `max_drift`.

An actor's throttle (`staleness.Throttle`) lets it run `max_staleness` versions ahead on the assumption that the
learner takes its share of every batch. Taking groups as they come breaks that assumption whenever one actor is
momentarily slower: the others fill the batch, the slow one's groups are taken a version later than its budget
counted on, and its last groups arrive past the bound and are thrown away (the tiny job lost 8 to 12 so). So each
batch takes exactly each actor's planned share, holding an actor's groups beyond it for the next batch, and the
budget's arithmetic becomes exact. A demand (an actor missing) lifts the shares for as long as actors keep a raised
one (`SHARE_RELAX_VERSIONS`). An actor that joins past the planned ones is counted in from the next version, and
every actor is told (wire.Pace), so their shares still add up to one batch. With `max_drift`, a step whose largest
group KL(behaviour ‖ learner) is over it sets the actors' lead to 0 (one share per version, then wait), and each
step within it lets them one version further ahead, up to max_staleness.
"""

from __future__ import annotations

import logging

from streamrl.algo import staleness
from streamrl.comm import wire
from streamrl.comm.control import ControlServer
from streamrl.config import Config

log = logging.getLogger("streamrl.learner")


class Pacer:
    def __init__(self, cfg: Config, control: ControlServer):
        self.control, self.batch = control, cfg.learner.batch_groups
        self.max_staleness, self.max_drift = cfg.max_staleness, cfg.max_drift
        # An actor that runs free (actors.throttle false) keeps no share: its groups are taken as they come.
        self.capped = cfg.actors.throttle or cfg.strict
        self.lead = cfg.max_staleness
        self.drift: float | None = None
        self.demanded_at: int | None = None
        # From which version which actors share each batch (a batch at an earlier version: the ones before).
        self.changes: list[tuple[int, list[str]]] = [(0, staleness.planned_actors(cfg.actors.num))]
        self.paces_sent = self.peers_seen = 0

    def shares(self, version: int) -> dict[str, int] | None:
        """Each actor's share of the batch at `version` (the groups it takes of theirs); None: take groups as they
        come (actors run free, or a demand raised some actors' shares lately)."""
        if self.demanded_at is not None and version - self.demanded_at < staleness.SHARE_RELAX_VERSIONS:
            return None
        return self.planned(version)

    def planned(self, version: int) -> dict[str, int] | None:
        """Each actor's planned share of the batch at `version`, raised or not by a demand (who has delivered its
        share, and can cover for one that has not); None: actors run free, with no share."""
        if not self.capped:
            return None
        actors = next(a for v, a in reversed(self.changes) if v <= version)
        return {a: staleness.paced_share(self.batch, actors, a) for a in actors}

    def demanded(self, version: int) -> None:
        self.demanded_at = version

    def joined(self, version: int) -> int | None:
        """Count in the actors that asked for weights and are not yet sharing the batch, from `version` + 1 (the
        learner is filling the batch of `version`: the others made their shares of it already). Returns that
        version when some joined, else None."""
        peers = self.control.actor_peers
        if len(peers) == self.peers_seen:  # asked every 100 ms while the learner waits: nothing new, nothing to do
            return None
        self.peers_seen = len(peers)
        current = self.actors
        new = [a for a in peers if a not in current and a not in self.control.refused_actors]
        if not new:
            return None
        actors = current + sorted(new)
        self.changes.append((version + 1, actors))
        log.info("learner: %s joined; %d actors share each batch from version %d", ", ".join(sorted(new)),
                 len(actors), version + 1)
        self._send(version + 1)
        return version + 1

    def observed(self, version: int, drift: float) -> None:
        """The drift a step measured (KL(behaviour ‖ learner), its largest group's) for the batch of `version`:
        actors hold to one share per version while it is over max_drift, and run ahead again one version more per
        step within it (back to max_staleness at once, the groups already queued ahead would overshoot again)."""
        self.drift = drift
        if self.max_drift is None:
            return
        lead = 0 if drift > self.max_drift else min(self.lead + 1, self.max_staleness)
        if lead != self.lead:
            self.lead = lead
            self._send(version + 1)

    def _send(self, version: int) -> None:
        self.control.pace(wire.Pace(version=version, lead=self.lead, actors=self.actors, drift=self.drift))
        self.paces_sent += 1

    def report(self) -> dict:
        """For the intake's accounting."""
        return {"paces_sent": self.paces_sent, "pacing_lead": self.lead,
                "actors_sharing": len(self.actors)}

    @property
    def actors(self) -> list[str]:
        """The actors sharing the batches from the newest change on."""
        return self.changes[-1][1]
