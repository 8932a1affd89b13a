"""Receive → validate → staleness gate: fills one batch of groups, and accounts for every group.

It waits for data through the session's one poller (`wait`), which also serves the control channel,
so a late actor never waits for the next broadcast; through that channel it asks actors that hold
back for missing groups (`Demand`).
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Callable

from streamrl.algo import staleness
from streamrl.comm.control import ControlServer
from streamrl.comm.groups import GroupReceiver
from streamrl.comm.codec import ScoredGroup
from streamrl.learner.escort import Escort
from streamrl.learner.stepstats import StrictModeViolation

log = logging.getLogger("streamrl.learner")


class UserCodeFailed(RuntimeError):
    """An actor reported that a user's function fails on most of its samples (a wire.ActorFailure)."""

    def __init__(self, f):
        super().__init__(f"{f.kind} {f.function} failed on {f.failed} of its last {f.window} {f.unit} in "
                         f"{f.actor_id} ({f.reason}): {f.error}")


class Intake:
    def __init__(self, receiver: GroupReceiver, control: ControlServer, group_size: int, max_staleness: int,
                 demand_after_s: float = 1.0, refused: Callable[[], int] = lambda: 0, strict: bool = False,
                 ranks: int = 1, wait: Callable[[int], object] | None = None):
        """wait(timeout_ms): block until a message may wait, serving control requests (the session's poller);
        default: the group socket alone."""
        self.receiver = receiver
        self.ranks = ranks  # learner ranks: each trains on an equal share of a batch's groups
        self.strict = strict  # on_policy=strict: a stale group is an error, never a silent drop
        self.control = control
        self.group_size = group_size
        self.max_staleness = max_staleness
        self.used = 0
        self.demand_after_s = demand_after_s
        self.refused = refused  # peers the CURVE gatekeeper turned away
        self.demands_sent = 0
        # Strict mode: the first version at which the actors' shares changed: the learner asked for missing groups,
        # or an actor joined. Actors that covered for a slow one made more than their share from then on (and one
        # that missed a joiner's Pace may have), so a stale group of that version or later is surplus the change
        # explains (dropped and counted); one from before it means an actor ran out of lockstep.
        self.first_demand_version: int | None = None
        self.gaps: collections.deque[float] = collections.deque(maxlen=100)  # between recent arrivals
        self._previous_arrival: float | None = None
        self.heard: dict[str, float] = {}  # each actor's last arrival (monotonic), for its own silence
        self.dropped: collections.Counter[str] = collections.Counter()
        self.dealing = None  # task.epochs (learner.dealing): only dealt prompts' groups pass; a drop is dealt again
        self.wait = wait or receiver.sock.poll
        self.pacer = None  # learner.pacing.Pacer: each actor's share of a batch, the actors sharing it, the drift
        self.held: collections.deque[ScoredGroup] = collections.deque()
        """Groups past their actor's share of a batch, taken first into the next (`collect`)."""
        self.escort = Escort()
        """Multi-layer GRPO: layer-2 groups waiting for the layer-1 group whose batch they join."""

    @property
    def received(self) -> int:
        """Groups that decoded and validated (rejected ones are in receiver.rejected)."""
        return self.receiver.received

    def collect(self, version: int, n: int, timeout_s: float, stop=lambda: False) -> tuple[list[ScoredGroup], float]:
        """n layer-1 groups that pass the gate at `version`, each with the multi-layer GRPO layer-2 groups of its
        responses' corrections (learner.escort: beside them as in MGRPO), and the seconds spent waiting for them.
        Layer-2 groups past a multiple of the learner's ranks are dropped and counted (`layer2_uneven_ranks`).

        Returns fewer than n only when `stop()` turns true. Raises TimeoutError if no group at all
        arrives for `timeout_s` (UserCodeFailed, StrictModeViolation: see `_fill`); the groups taken for the batch
        then count as `lost_at_failure`, so a run a failure stopped still balances. When no group has come for
        clearly longer than groups usually take (`demand_wait_s`), it asks actors that hold back to stay within the
        staleness bound for the missing groups, and asks again as often (with shares: `_demand_due`, `_cover`).
        """
        t0 = time.perf_counter()
        batch: list[ScoredGroup] = []
        deferred: list[ScoredGroup] = []  # groups past their actor's share of this batch: the next batch's first
        for group in self.escort.expire(version, self.max_staleness):
            self._drop(group, "stale")
        try:
            self._fill(batch, deferred, version, n, timeout_s, stop)
        except BaseException:  # a failure ends the run here: what this batch took (or holds) is never trained
            self.dropped["lost_at_failure"] += len(batch) + len(deferred) + len(self.held) + self.escort.clear()
            self.held.clear()
            raise
        self.held.extend(deferred)
        if sum(g.layer == 1 for g in batch) < n and not (self.exhausted and batch):  # stopping: never trained on
            self.dropped["lost_at_shutdown"] += len(batch)
            batch = []
        batch = self._even(batch)
        self.used += len(batch)
        return batch, time.perf_counter() - t0

    def _fill(self, batch: list[ScoredGroup], deferred: list[ScoredGroup], version: int, n: int, timeout_s: float,
              stop) -> None:
        """Take groups into `batch` until it holds n layer-1 groups, `stop()`, or the last epoch is in it (collect);
        those past their actor's share of the batch into `deferred`."""
        have = 0  # layer-1 groups in `batch`
        # task.epochs: a dealt group is claimed as it is taken, so none may wait for a later batch
        paced = self.pacer is not None and self.dealing is None  # planned: who owes what, even while `shares` lift
        planned, shares = (self.pacer.planned(version), self.pacer.shares(version)) if paced else (None, None)
        took: collections.Counter[str] = collections.Counter()  # layer-1 groups of each actor in `batch`
        begun = last_arrival = last_demand = last_note = time.monotonic()
        while have < n and not stop() and not self.exhausted:
            self.wait(0 if self.receiver.pending or self.receiver.handed_back or self.held else 100)  # groups wait
            self._joined(version)
            if self.dealing is not None:  # a dead actor's dealt prompts are dealt again as soon as its connection closes
                self.dealing.reap()
            while have < n:
                group, held = self._next()
                if group is None:
                    break
                if group.layer != 1:  # rides with the layer-1 group that comes next from its session
                    if (verdict := "ok" if held else self._verdict(group, version)) == "ok":
                        self.escort.wait(group)
                    else:
                        self._drop(group, verdict)
                    continue
                batch.append(group)  # in hand: a verdict that raises (strict) leaves it counted with the batch
                verdict = self._gate(group, version) if held else self._verdict(group, version)
                riders = self.escort.riders(group)
                batch.pop()
                if verdict != "ok":
                    for g in (*riders, group):
                        self._drop(g, verdict)
                elif shares is not None and took[group.actor_id] >= shares.get(group.actor_id, n):
                    deferred += [*riders, group]
                else:
                    batch += [*riders, group]
                    have += 1
                    took[group.actor_id] += 1
            last_arrival = max(last_arrival, self._previous_arrival or last_arrival)
            if self.receiver.failures:  # a user's function is broken: training on what is left would be pointless
                raise UserCodeFailed(self.receiver.failures[0])
            now = time.monotonic()
            # No demand before the first group of the run: how long groups take is unknown until then (an engine's
            # first generate call can take minutes), and the groups asked for would arrive beside the slow ones.
            if have < n and now - last_demand > self.demand_wait_s and self._demand_due(planned, took, begun, now):
                self._demand(version, n - have, deferred, _cover(planned, took, n - have))
                shares, last_demand = None, now
            if now - last_arrival > 30 and now - last_note > 30:  # a stall shows in the log, not only at the end
                log.warning("learner: no group for %.0fs at version %d (have %d/%d); giving up after %.0fs "
                            "(learner.data_timeout_s)", now - last_arrival, version, have, n, timeout_s)
                last_note = now
            if now - last_arrival > timeout_s:
                raise TimeoutError(
                    f"learner: no scored group arrived for {timeout_s:.0f}s at policy version {version} "
                    f"(have {have}/{n} for this batch); are the actors alive and pointed at this learner?")

    def _joined(self, version: int) -> None:
        """Actors that joined share the batches from the next version on (strict: the others made their shares of
        this version already, so a surplus group of it is explained)."""
        if self.pacer is not None and self.pacer.joined(version) is not None and self.strict:
            self._explain_surplus_from(version)

    def _demand_due(self, planned: dict[str, int] | None, took: collections.Counter[str], begun: float,
                    now: float) -> bool:
        """Whether the actors that owe groups to this batch (no shares: any actor) have sent none for longer than
        `demand_wait_s`, counting from `begun` (the batch's start: the learner's step before is no actor's silence).
        With shares, the silence is that of the actors owing part of theirs (another's groups held past its share
        may arrive meanwhile), and while every actor owes part of its share none is asked: they are all still
        working (a generate call slower than the gaps seen so far), and what the others would make on demand
        arrives beside theirs, as surplus, stale in strict mode."""
        if self._previous_arrival is None:
            return False
        heard = self._previous_arrival
        if planned is not None:
            owing = [a for a, share in planned.items() if took[a] < share]
            if len(owing) == len(planned):
                return False
            heard = max((self.heard.get(a, begun) for a in owing), default=heard)
        # and no sooner than the silence of every actor: at start-up, or when one is a call behind, the owing actor's
        # groups come right after the others' (a demand then only makes surplus, stale in strict mode)
        return now - max(begun, heard, self._previous_arrival) > self.demand_wait_s

    def _demand(self, version: int, missing: int, deferred: list[ScoredGroup], counts: dict[str, int] | None) -> None:
        """Ask the actors `counts` names (None: every actor) for `missing` groups: they take on more than their
        shares, and so does the batch (its groups held past their actor's share come back into it), until the
        shares relax again."""
        self.control.demand(version, missing, counts)
        self.demands_sent += 1
        self._explain_surplus_from(version)
        if self.pacer is not None:
            self.pacer.demanded(version)
        self.held.extend(deferred)
        deferred.clear()

    def _drop(self, group: ScoredGroup, verdict: str) -> None:
        self.dropped[verdict] += 1
        if self.dealing is not None:
            self.dealing.dropped(group, verdict)

    def _next(self) -> tuple[ScoredGroup | None, bool]:
        """The next group, and whether it was held: held ones first (past their actor's share of an earlier batch;
        only their lag has changed since), then what arrives (timed, for `demand_wait_s`)."""
        if self.held:
            return self.held.popleft(), True
        group = self.receiver.take()
        if group is not None:
            now = time.monotonic()
            if self._previous_arrival is not None:
                self.gaps.append(now - self._previous_arrival)
            self._previous_arrival = self.heard[group.actor_id] = now
        return group, False

    @property
    def exhausted(self) -> bool:
        """task.epochs: every prompt is dealt and those still out are in the batch (the last, partial one)."""
        return self.dealing is not None and self.dealing.exhausted

    def _even(self, batch: list[ScoredGroup]) -> list[ScoredGroup]:
        """The batch with as many groups as the ranks divide evenly: the last layer-2 groups over are dropped."""
        over = len(batch) % self.ranks
        if not over:
            return batch
        drop = {id(g) for g in [g for g in batch if g.layer != 1][-over:]}
        self.dropped["layer2_uneven_ranks"] += len(drop)
        return [g for g in batch if id(g) not in drop]

    def drain(self, timeout_s: float) -> None:
        """At shutdown, after actors were told to stop: take what is still on the way, counting it as
        lost_at_shutdown, until every actor session still sending has reported (or timeout_s)."""
        deadline = time.monotonic() + timeout_s
        if self.held or self.escort:  # a Counter key only where something was lost (the accounting lists its keys)
            self.dropped["lost_at_shutdown"] += len(self.held) + self.escort.clear()
            self.held.clear()
        while time.monotonic() < deadline:
            while self.receiver.take() is not None:
                self.dropped["lost_at_shutdown"] += 1
            if all(c.report is not None for c in self._live_sessions()):
                return
            self.wait(50)

    def _live_sessions(self):
        """Sessions that sent a group and have not reported (killed actors never will: see timeout)."""
        return [c for c in self.receiver.sessions.values() if c.report is None and c.received]

    @property
    def demand_wait_s(self) -> float:
        """How long a silence means missing actors rather than slow ones: ≥ 3× the longest recent
        gap between groups, so actors that take minutes per generate call are not mistaken for gone."""
        return max(self.demand_after_s, 3 * max(self.gaps, default=0.0))

    def _verdict(self, group: ScoredGroup, version: int) -> str:
        if group.actor_id in self.control.refused_actors:  # its config differs: refused at its weights request
            return "refused_actor"
        if group.group_size != self.group_size:
            if not self.dropped["wrong_group_size"]:
                log.warning("dropping group from %s with %d samples; this run uses group_size %d",
                            group.actor_id, group.group_size, self.group_size)
            return "wrong_group_size"
        verdict = self._gate(group, version)
        if verdict == "ok" and self.dealing is not None and not self.dealing.accept(group):
            return "not_dealt"  # a prompt no longer dealt to its session (dealt again, or before a restart)
        return verdict

    def _gate(self, group: ScoredGroup, version: int) -> str:
        """The staleness gate; strict mode refuses a stale group that no change of the actors' shares explains."""
        verdict = staleness.gate(version, group.policy_version, self.max_staleness)
        if verdict == "stale" and self.strict and not self._surplus_after_demand(group):
            raise StrictModeViolation(
                f"a group from {group.actor_id} generated at policy version {group.policy_version} arrived at learner "
                f"version {version} (lag {staleness.lag(version, group.policy_version)}; strict needs 0): an actor "
                "generated past its share of a version, or from weights older than the newest")
        return verdict

    def _explain_surplus_from(self, version: int) -> None:
        if self.first_demand_version is None:
            self.first_demand_version = version

    def _surplus_after_demand(self, group: ScoredGroup) -> bool:
        surplus = self.first_demand_version is not None and group.policy_version >= self.first_demand_version
        if surplus and not self.dropped["stale"]:
            log.warning("strict: dropping a group of version %d from %s as surplus: actors have covered for missing "
                        "ones since the demand at version %d (no consumed group is stale)", group.policy_version,
                        group.actor_id, self.first_demand_version)
        return surplus

    def failure_report(self) -> dict:
        """For summary.json: multi-turn episodes' counts summed over the actors' reports (`episodes`: tool calls by
        tool/outcome, truncations by reason), and the first actor's word that a user's function is broken, with
        every count (each absent when there is none)."""
        episodes = reward_failures(c.report.episode_counts for c in self.receiver.sessions.values() if c.report)
        out = {"episodes": episodes} if episodes else {}
        if not self.receiver.failures:
            return out
        f = self.receiver.failures[0]
        return {**out, "user_code_failure": {"actor": f.actor_id, "kind": f.kind, "function": f.function,
                                             "reason": f.reason,
                                      "failed": f.failed, "window": f.window, "error": f.error,
                                      "traceback": f.traceback, "counts": dict(f.reward_failures)}}

    def reconciliation(self) -> dict:
        """Every group, from each actor session's own count to what became of it at the learner.

        For a session that reported, groups sent = received + rejected (ZeroMQ keeps order, and the report
        comes last). For one that did not (killed), what it sent after the last group the learner
        saw is unknowable; `sent` is then what the learner saw, and the session is listed. A report that
        does not match the session's own numbering is listed in `contradicted_sessions`. `balanced`: every
        group the actors sent was used, dropped (by reason), rejected, or lost with a restarted learner's
        process, none lost otherwise, and no report contradicts what arrived.
        """
        sessions = self.receiver.sessions
        sent = sum(c.sent for c in sessions.values())
        received_by_session = sum(c.received for c in sessions.values())
        lost = sum(c.lost for c in sessions.values())
        contradicted = {f"{a}/{s}": why for (a, s), c in sessions.items() if (why := c.contradiction)}
        return {
            "actor_sessions": len(sessions),
            "groups_sent_by_actors": sent,
            "groups_generated_by_actors": sum(c.report.groups_generated for c in sessions.values() if c.report),
            "groups_rejected": sum(c.rejected for c in sessions.values()),
            "duplicates": self.receiver.duplicates,
            "lost_in_learner_restart": sum(c.restart_lost for c in sessions.values()),
            "lost_in_transit": lost,
            "unreported_sessions": sorted(f"{a}/{s}" for (a, s), c in sessions.items() if c.report is None)[:100],
            "unreported_session_count": sum(c.report is None for c in sessions.values()),
            "contradicted_sessions": dict(list(contradicted.items())[:100]),
            "sessions": {f"{a}/{s}": {"sent": c.sent, "received": c.received, "reported": c.report is not None}
                         for (a, s), c in list(sessions.items())[:100]},
            "balanced": (self.received == self.used + sum(self.dropped.values()) + self.receiver.duplicates
                         and received_by_session + self.receiver.duplicates == self.received
                         and lost == 0 and not contradicted),
        }

    def sessions(self) -> list[dict]:
        """Every actor session's counts, for sessions.json (summary.json holds the first 100: its size stays
        within the space reserved for it whatever the number of sessions)."""
        return [{"actor": a, "session": s, "sent": c.sent, "received": c.received, "rejected": c.rejected,
                 "duplicates": c.duplicates, "lost": c.lost, "lost_in_learner_restart": c.restart_lost,
                 "reported": c.report is not None, "contradiction": c.contradiction}
                for (a, s), c in self.receiver.sessions.items()]

    def state(self) -> dict:
        """What a checkpoint keeps of the accounting, for a resumed learner to go on from (`restore`)."""
        return {"used": self.used, "dropped": dict(self.dropped), "demands_sent": self.demands_sent,
                "held": len(self.held) + len(self.escort), "receiver": self.receiver.state()}

    def restore(self, state: dict) -> None:
        self.used, self.demands_sent = state["used"], state["demands_sent"]
        self.dropped.update(state["dropped"])
        if state.get("held"):  # received by the life that saved it, held for its next batch: gone with that process
            self.dropped["held_at_restart"] += state["held"]
        self.receiver.restore(state["receiver"])

    def accounting(self) -> dict:
        return {
            "groups_received": self.received,
            "groups_used": self.used,
            "groups_dropped": {**self.dropped, **({"duplicate": d} if (d := self.receiver.duplicates) else {})},
            "reward_failures": reward_failures(c.reward_failure_counts for c in self.receiver.sessions.values()),
            # multi-turn episodes so far: tool calls by tool/outcome, truncations by reason, step_raised ({}: none)
            "episode_counts": reward_failures(c.episode_count_totals for c in self.receiver.sessions.values()),
            "messages_rejected": dict(self.receiver.rejected.counts),
            "weight_requests_rejected": dict(self.control.rejected.counts),
            "weight_requests_served": self.control.publisher.requests_served,
            "demands_sent": self.demands_sent,
            **(self.pacer.report() if self.pacer is not None else {}),
            "peers_refused": self.refused(),
        }


def reward_failures(per_session) -> dict[str, int]:
    """Samples the actors' reward functions left unscored, by reason, summed over the sessions (each: its final
    report's count once it reported, else what its groups carried so far)."""
    out: dict[str, int] = {}
    for counts in per_session:
        for why, n in counts.items():
            out[why] = out.get(why, 0) + n
    return dict(sorted(out.items()))


def _cover(planned: dict[str, int] | None, took: collections.Counter[str], missing: int) -> dict[str, int] | None:
    """The `missing` groups split exactly among the actors that delivered their planned share of the batch (`took`:
    each actor's layer-1 groups in it), in share order; None without shares (every actor is asked)."""
    if planned is None:
        return None
    cover = [a for a, share in planned.items() if took[a] >= share]
    base, extra = divmod(missing, len(cover))
    return {a: base + (i < extra) for i, a in enumerate(cover) if base + (i < extra)}
