"""The group channel: actors PUSH scored groups, the learner PULLs them.

Both ends have a small high-water mark, so a slow learner blocks actors (backpressure) instead of
queueing without bound. Besides groups it carries an actor's last word (ActorReport, which closes
its session's accounting) and its answers to eval requests (EvalResult), in order with its groups.
"""

from __future__ import annotations

import collections
import dataclasses
import time
import uuid

import zmq

from streamrl.comm import codec, wire
from streamrl.comm.codec import ScoredGroup
from streamrl.comm.security import Curve
from streamrl.comm.sockets import RejectCounter, bind, make
from streamrl.comm.weights import chunks


def batches(groups: list[ScoredGroup], max_bytes: int) -> list[list[ScoredGroup]]:
    """`groups` in order, cut into runs whose arrays take at most `max_bytes` (a larger group goes
    alone, and keeps its zero-copy frames; 0: one group per run)."""
    out: list[list[ScoredGroup]] = []
    size = max_bytes + 1
    for g in groups:
        n = codec.group_nbytes(g)
        if size + n > max_bytes:
            out.append([])
            size = 0
        out[-1].append(g)
        size += n
    return out


class GroupSender:
    """Actor side of the group channel (PUSH, connects).

    Small groups travel several to a message (`send_batch`, up to `batch_max_bytes` of arrays):
    a message costs a fixed few microseconds at each end, and the receiver validates a batch's
    arrays in one pass. The high-water mark counts messages, so a full queue holds up to
    `hwm × batch_max_bytes` of small groups, or `hwm` groups larger than that.
    """

    def __init__(self, ctx: zmq.Context, addr: str, hwm: int, actor_id: str = "actor", curve: Curve | None = None,
                 batch_max_bytes: int = 0):
        self.sock = make(ctx, zmq.PUSH, curve=curve)
        self.sock.setsockopt(zmq.SNDHWM, hwm)
        self.sock.connect(addr)
        self.blocked_s = 0.0
        self.actor_id = actor_id
        self.session = uuid.uuid4().hex[:12]  # this life of the actor: a restart is a new session
        self.sent = 0
        self.batch_max_bytes = batch_max_bytes

    def batches(self, groups: list[ScoredGroup]) -> list[list[ScoredGroup]]:
        return batches(groups, self.batch_max_bytes)

    def send(self, group: ScoredGroup, timeout_s: float) -> bool:
        """Send one group; False if the learner applied backpressure for `timeout_s`."""
        return self.send_batch([group], timeout_s)

    def send_batch(self, groups: list[ScoredGroup], timeout_s: float) -> bool:
        """Send `groups` as one message; False, with no seq used up, if the learner applied backpressure
        for `timeout_s`."""
        for i, group in enumerate(groups):
            group.session, group.seq = self.session, self.sent + i
        frames = codec.encode_groups(groups)
        # Zero-copy frames carry a fixed bookkeeping cost; below ~64 KB copying is cheaper.
        copy = sum(memoryview(f).nbytes for f in frames) < chunks.ZERO_COPY_MIN
        try:
            self.sock.send_multipart(frames, zmq.NOBLOCK, copy=copy)  # the usual case: room in the queue
        except zmq.Again:
            t0 = time.perf_counter()
            ready = self.sock.poll(int(timeout_s * 1000), zmq.POLLOUT)
            self.blocked_s += time.perf_counter() - t0
            if not ready:
                return False
            self.sock.send_multipart(frames, copy=copy)
        self.sent += len(groups)
        return True

    def report(self, groups_generated: int, reason: str, timeout_s: float = 2.0,
               reward_failures: dict[str, int] | None = None, episode_counts: dict[str, int] | None = None) -> bool:
        """Send the ActorReport that closes this session's accounting (after every group it sent)."""
        msg = wire.ActorReport(actor_id=self.actor_id, session=self.session, groups_sent=self.sent,
                               groups_generated=groups_generated, reason=reason, reward_failures=reward_failures or {},
                               episode_counts=episode_counts or {})
        if not self.sock.poll(int(timeout_s * 1000), zmq.POLLOUT):
            return False
        self.sock.send_multipart(wire.encode(msg), zmq.NOBLOCK)
        return True

    def failure(self, error, timeout_s: float = 2.0) -> bool:
        """Tell the learner a user's function is broken (`error`: a reward_health.UserCodeFailure), so the run stops
        with its cause; False if the learner took nothing for timeout_s."""
        msg = wire.ActorFailure(actor_id=self.actor_id, session=self.session, function=error.function,
                                reason=error.reason, failed=error.failed, window=error.window, error=error.error,
                                traceback=error.traceback[-8000:], reward_failures=error.counts,
                                kind=error.kind, unit=error.unit)
        return self.notice(msg, timeout_s)

    def notice(self, msg: wire.EvalResult | wire.ActorFailure, timeout_s: float) -> bool:
        """Send a header-only message (an eval result) on the group channel; False if the learner took nothing for
        timeout_s."""
        if not self.sock.poll(int(timeout_s * 1000), zmq.POLLOUT):
            return False
        self.sock.send_multipart(wire.encode(msg), zmq.NOBLOCK)
        return True

    def close(self, linger_s: float = 0.0) -> None:
        """linger_s > 0: give queued groups and the report that long to reach a learner still listening."""
        self.sock.close(linger=int(linger_s * 1000))


MAX_SESSIONS = 10_000
OVERFLOW = ("(too many sessions)", "")  # the one count of every session past MAX_SESSIONS: its seqs interleave


@dataclasses.dataclass
class SessionCount:
    """What the learner saw from one life of one actor. Its groups carry seq 0, 1, 2, … in send order and ZeroMQ
    keeps a connection's order, so a seq at or below the highest seen is a duplicate, and a report that does not
    match the highest seq contradicts what arrived."""

    received: int = 0
    max_seq: int = -1
    report: wire.ActorReport | None = None
    reward_failures: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    """What its groups carried of its reward failures (the report, when it comes, holds the session's total)."""
    rejected: int = 0
    """Groups of its messages rejected at the wire (counted when the message's header still named the session)."""
    duplicates: int = 0
    reports: int = 0
    after_report: int = 0
    """Groups that arrived after its report, which ZeroMQ's order makes impossible for an honest actor."""
    restored_seq: int | None = None
    """The session's max_seq in the checkpoint a resumed learner started from; None: seen only in this life."""
    restart_lost: int = 0
    """Groups it sent to the learner's previous life after that checkpoint: lost with that process."""

    episode_counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    """What its groups carried of its episodes' counts (the report, when it comes, holds the session's total)."""
    broken: dict[str, int] = dataclasses.field(default_factory=dict)
    """Its ActorFailure's counts (the reward functions' own totals, which a report sent after it may lack)."""

    @property
    def reward_failure_counts(self) -> dict[str, int]:
        """The session's reward failures: its report's total once it reported, else what its groups carried (each
        reason at least what its ActorFailure said: every count is a running total)."""
        counts = dict(self.report.reward_failures) if self.report else dict(self.reward_failures)
        return {k: max(counts.get(k, 0), self.broken.get(k, 0)) for k in sorted({*counts, *self.broken})}

    @property
    def episode_count_totals(self) -> dict[str, int]:
        """The session's episode counts: its report's once it reported, else what its groups carried."""
        return dict(self.report.episode_counts) if self.report else dict(self.episode_counts)

    @property
    def sent(self) -> int:
        """The actor's own count if it reported; else at least every seq the learner saw."""
        return self.report.groups_sent if self.report else max(self.max_seq + 1, self.received + self.rejected)

    @property
    def lost(self) -> int:
        """Sent and neither received, rejected, nor lost with a restarted learner: 0 unless something went wrong."""
        return self.sent - self.received - self.rejected - self.restart_lost

    @property
    def contradiction(self) -> str | None:
        """Why what this session reported cannot be what it sent, or None."""
        if self.reports > 1:
            return f"{self.reports} reports"
        if self.after_report:
            return f"{self.after_report} groups after its report"
        quiet_since_restore = self.restored_seq is not None and self.max_seq == self.restored_seq
        if self.report is not None and self.report.groups_sent != self.max_seq + 1 and not quiet_since_restore:
            return (f"reported {self.report.groups_sent} groups sent; the last that arrived was number "
                    f"{self.max_seq + 1}")
        return None

    def seen(self, seq: int) -> None:
        """A group numbered seq arrived (or was rejected with its header readable)."""
        if self.restored_seq is not None and self.max_seq == self.restored_seq and seq > self.max_seq + 1:
            self.restart_lost = seq - self.max_seq - 1  # the first group of this learner life
        self.max_seq = max(self.max_seq, seq)

    def state(self) -> dict:
        """What a checkpoint keeps of the session (JSON)."""
        r = self.report
        return {"received": self.received, "max_seq": self.max_seq, "rejected": self.rejected,
                "duplicates": self.duplicates, "restart_lost": self.restart_lost,
                "reward_failures": dict(self.reward_failures), "episode_counts": dict(self.episode_counts),
                "report": None if r is None else {"groups_sent": r.groups_sent, "groups_generated": r.groups_generated,
                                                  "reason": r.reason, "reward_failures": dict(r.reward_failures),
                                                  "episode_counts": dict(r.episode_counts)}}

    @classmethod
    def restore(cls, actor_id: str, session: str, state: dict) -> "SessionCount":
        r = state.get("report")
        report = None if r is None else wire.ActorReport(actor_id=actor_id, session=session, **r)
        return cls(received=state["received"], max_seq=state["max_seq"], report=report, reports=int(report is not None),
                   reward_failures=collections.Counter(state.get("reward_failures", {})),
                   episode_counts=collections.Counter(state.get("episode_counts", {})),
                   rejected=state.get("rejected", 0), duplicates=state.get("duplicates", 0),
                   restart_lost=state.get("restart_lost", 0), restored_seq=state["max_seq"])


class GroupReceiver:
    """Learner side of the group channel (PULL, binds). Validates every message.

    A message (one or more groups) is decoded whole and its groups handed out one by one from `pending`;
    groups count as received when handed out, so the accounting is the same as for one group
    per message, and the next message (an actor's report, say) is read only after them.
    """

    def __init__(self, ctx: zmq.Context, addr: str, hwm: int, max_bytes: int, vocab_size: int | None,
                 curve: Curve | None = None, reward_range: tuple[float, float] | None = None):
        """reward_range: the run's lowest and highest shaped reward; a group with a reward outside it is rejected
        (`reward_out_of_range`). None: any finite reward."""
        self.reward_range = reward_range
        self.duplicates = 0
        self.sock = make(ctx, zmq.PULL, max_bytes, curve)
        self.sock.setsockopt(zmq.RCVHWM, hwm)
        bind(self.sock, addr, "group channel")
        self.vocab_size = vocab_size
        self.rejected = RejectCounter("group receiver")
        self.received = 0
        self.sessions: dict[tuple[str, str], SessionCount] = {}
        self.handed_back: collections.deque[ScoredGroup] = collections.deque()
        self.pending: collections.deque[ScoredGroup] = collections.deque()
        """Groups of a batch message already decoded and not yet taken."""
        self.eval_results: collections.deque[wire.EvalResult] = collections.deque(maxlen=MAX_SESSIONS)
        """Actors' answers to eval requests, in arrival order, for the learner's evaluation bookkeeping to take."""
        self.failures: collections.deque[wire.ActorFailure] = collections.deque(maxlen=16)
        """Actors' word that a user's function is broken: the intake stops the run with the first."""

    def take(self) -> ScoredGroup | None:
        """One waiting group, decoded and validated; None if nothing waits or it was rejected.
        Actor reports on the way are recorded in `sessions`."""
        if self.handed_back:
            return self.handed_back.popleft()
        while True:
            if self.pending:
                if (group := self._count(self.pending.popleft())) is not None:
                    return group
                continue
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return None
            header = None
            try:
                header = wire.decode_header(frames)
                if isinstance(header, wire.ActorReport):
                    self._reported(header)
                    continue
                if isinstance(header, wire.EvalResult):
                    self.eval_results.append(header)
                    continue
                if isinstance(header, wire.ActorFailure):
                    self.failures.append(header)
                    self._session(header.actor_id, header.session).broken = dict(header.reward_failures)
                    continue
                groups = codec.decode_groups(frames, header, vocab_size=self.vocab_size)
                codec.check_rewards(groups, self.reward_range)
                self.pending.extend(groups)
            except wire.WireError as e:
                self.rejected(e)
                if isinstance(header, codec.GroupBatchHeader) and header.groups:  # whose groups they were
                    count = self._session(header.actor_id, header.session)
                    count.rejected += len(header.groups)
                    count.seen(max(g.seq for g in header.groups))
                return None

    def hand_back(self, groups: list[ScoredGroup]) -> None:
        """Groups taken (and counted) but not used yet: `take` returns them first, in order, without counting again
        (evaluation bookkeeping reads past them to the answers queued behind them)."""
        self.handed_back.extend(groups)

    def _reported(self, report: wire.ActorReport) -> None:
        count = self._session(report.actor_id, report.session)
        count.reports += 1
        if count.report is None:  # the first word stands; a second one is a contradiction, flagged
            count.report = report
            if count.restored_seq is not None and count.max_seq == count.restored_seq:
                count.restart_lost = max(0, report.groups_sent - count.max_seq - 1)

    def _count(self, group: ScoredGroup) -> ScoredGroup | None:
        """The group, counted; None for a duplicate (a seq its session already sent), counted apart."""
        self.received += 1
        count = self._session(group.actor_id, group.session)
        if 0 <= group.seq <= count.max_seq and count is not self.sessions.get(OVERFLOW):
            count.duplicates += 1
            self.duplicates += 1
            return None
        if count.report is not None and count is not self.sessions.get(OVERFLOW):
            count.after_report += 1
        count.received += 1
        count.seen(group.seq)
        if group.reward_failures:
            count.reward_failures.update(group.reward_failures)
        if group.episode_counts:
            count.episode_counts.update(group.episode_counts)
        return group

    def state(self) -> dict:
        """The accounting a checkpoint keeps: what was received, rejected and duplicated, and every session's count."""
        return {"received": self.received, "duplicates": self.duplicates, "rejected": dict(self.rejected.counts),
                "sessions": [[a, s, c.state()] for (a, s), c in self.sessions.items()]}

    def restore(self, state: dict) -> None:
        """Continue the accounting of a checkpoint (a resumed learner): its sessions go on where it saw them."""
        self.received, self.duplicates = state["received"], state["duplicates"]
        self.rejected.counts.update(state["rejected"])
        self.sessions = {(a, s): SessionCount.restore(a, s, c) for a, s, c in state["sessions"]}

    def _session(self, actor_id: str, session: str) -> SessionCount:
        key = (actor_id, session)
        if key not in self.sessions and len(self.sessions) >= MAX_SESSIONS:
            key = OVERFLOW  # memory stays bounded whatever peers claim to be
        if key not in self.sessions:
            self.sessions[key] = SessionCount()
        return self.sessions[key]

    def close(self) -> None:
        self.sock.close(linger=0)
