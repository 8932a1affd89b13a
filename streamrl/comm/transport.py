"""ZeroMQ channels between actors and the learner.

- Group channel: actors PUSH scored groups, the learner PULLs. Both ends have a small high-water
  mark, so a slow learner blocks actors (backpressure) instead of queueing without bound.
- Weight channel: the learner PUBlishes each new version; actors SUBscribe. A late or lagging
  actor asks the learner's ROUTER for the newest weights (WeightsRequest) and gets them at once.
- Control notices (Demand, Shutdown) go to each known actor through the ROUTER: PUB drops
  messages when a subscriber's small queue is full of weights, and a notice must not be lost.

Receivers never raise on bad input: a rejected message is counted in `rejected[reason]` and
logged once per reason.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
import uuid
from typing import Callable

import zmq

from streamrl.comm import chunks, wire
from streamrl.comm.security import Curve

log = logging.getLogger(__name__)


def endpoint(host: str, port: int) -> str:
    return f"tcp://{host}:{port}"


class RejectCounter:
    """Counts rejected messages by reason and logs the first of each kind."""

    def __init__(self, where: str):
        self.where = where
        self.counts: collections.Counter[str] = collections.Counter()

    def __call__(self, err: wire.WireError) -> None:
        if not self.counts[err.reason]:
            log.warning("%s rejected a message (%s); further ones of this kind are only counted", self.where, err)
        self.counts[err.reason] += 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _socket(ctx: zmq.Context, kind: int, max_bytes: int | None = None, curve: Curve | None = None) -> zmq.Socket:
    s = ctx.socket(kind)
    s.setsockopt(zmq.LINGER, 0)
    if max_bytes:
        s.setsockopt(zmq.MAXMSGSIZE, max_bytes)
    if curve is not None:
        curve.apply(s)
    return s


def _bind(sock: zmq.Socket, addr: str, what: str) -> None:
    try:
        sock.bind(addr)
    except zmq.ZMQError as e:
        raise RuntimeError(
            f"cannot bind the {what} to {addr} ({e}); is another run using it? Choose another port "
            "in the transport section (0 = any free port under `streamrl run`)") from None


def batches(groups: list[wire.ScoredGroup], max_bytes: int) -> list[list[wire.ScoredGroup]]:
    """`groups` in order, cut into runs whose arrays take at most `max_bytes` (a larger group goes
    alone, and keeps its zero-copy frames; 0: one group per run)."""
    out: list[list[wire.ScoredGroup]] = []
    size = max_bytes + 1
    for g in groups:
        n = wire.group_nbytes(g)
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
        self.sock = _socket(ctx, zmq.PUSH, curve=curve)
        self.sock.setsockopt(zmq.SNDHWM, hwm)
        self.sock.connect(addr)
        self.blocked_s = 0.0
        self.actor_id = actor_id
        self.session = uuid.uuid4().hex[:12]  # this life of the actor: a restart is a new session
        self.sent = 0
        self.batch_max_bytes = batch_max_bytes

    def batches(self, groups: list[wire.ScoredGroup]) -> list[list[wire.ScoredGroup]]:
        return batches(groups, self.batch_max_bytes)

    def send(self, group: wire.ScoredGroup, timeout_s: float) -> bool:
        """Send one group; False if the learner applied backpressure for `timeout_s`."""
        return self.send_batch([group], timeout_s)

    def send_batch(self, groups: list[wire.ScoredGroup], timeout_s: float) -> bool:
        """Send `groups` as one message; False, with no seq used up, if the learner applied backpressure
        for `timeout_s`."""
        for i, group in enumerate(groups):
            group.session, group.seq = self.session, self.sent + i
        frames = wire.encode_groups(groups)
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
               reward_failures: dict[str, int] | None = None) -> bool:
        """Send the ActorReport that closes this session's accounting (after every group it sent)."""
        msg = wire.ActorReport(actor_id=self.actor_id, session=self.session, groups_sent=self.sent,
                               groups_generated=groups_generated, reason=reason, reward_failures=reward_failures or {})
        if not self.sock.poll(int(timeout_s * 1000), zmq.POLLOUT):
            return False
        self.sock.send_multipart(wire.encode(msg), zmq.NOBLOCK)
        return True

    def notice(self, msg: wire.EvalResult, timeout_s: float) -> bool:
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


@dataclasses.dataclass
class SessionCount:
    """What the learner saw from one life of one actor."""

    received: int = 0
    max_seq: int = -1
    report: wire.ActorReport | None = None
    reward_failures: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    """What its groups carried of its reward failures (the report, when it comes, holds the session's total)."""

    @property
    def reward_failure_counts(self) -> dict[str, int]:
        """The session's reward failures: its report's total once it reported, else what its groups carried."""
        return dict(self.report.reward_failures) if self.report else dict(self.reward_failures)

    @property
    def sent(self) -> int:
        """The actor's own count if it reported; else at least every seq the learner saw."""
        return self.report.groups_sent if self.report else max(self.max_seq + 1, self.received)


class GroupReceiver:
    """Learner side of the group channel (PULL, binds). Validates every message.

    A message (one or more groups) is decoded whole and its groups handed out one by one from `pending`;
    groups count as received when handed out, so the accounting is the same as for one group
    per message, and the next message (an actor's report, say) is read only after them.
    """

    def __init__(self, ctx: zmq.Context, addr: str, hwm: int, max_bytes: int, vocab_size: int | None,
                 curve: Curve | None = None):
        self.sock = _socket(ctx, zmq.PULL, max_bytes, curve)
        self.sock.setsockopt(zmq.RCVHWM, hwm)
        _bind(self.sock, addr, "group channel")
        self.vocab_size = vocab_size
        self.rejected = RejectCounter("group receiver")
        self.received = 0
        self.sessions: dict[tuple[str, str], SessionCount] = {}
        self.pending: collections.deque[wire.ScoredGroup] = collections.deque()
        """Groups of a batch message already decoded and not yet taken."""
        self.eval_results: collections.deque[wire.EvalResult] = collections.deque(maxlen=MAX_SESSIONS)
        """Actors' answers to eval requests, in arrival order, for the learner's evaluation bookkeeping to take."""

    def take(self) -> wire.ScoredGroup | None:
        """One waiting group, decoded and validated; None if nothing waits or it was rejected.
        Actor reports on the way are recorded in `sessions`."""
        while True:
            if self.pending:
                return self._count(self.pending.popleft())
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return None
            try:
                header = wire.decode_header(frames)
                if isinstance(header, wire.ActorReport):
                    self._session(header.actor_id, header.session).report = header
                    continue
                if isinstance(header, wire.EvalResult):
                    self.eval_results.append(header)
                    continue
                self.pending.extend(wire.decode_groups(frames, header, vocab_size=self.vocab_size))
            except wire.WireError as e:
                self.rejected(e)
                return None

    def _count(self, group: wire.ScoredGroup) -> wire.ScoredGroup:
        self.received += 1
        count = self._session(group.actor_id, group.session)
        count.received += 1
        count.max_seq = max(count.max_seq, group.seq)
        if group.reward_failures:
            count.reward_failures.update(group.reward_failures)
        return group

    def _session(self, actor_id: str, session: str) -> SessionCount:
        key = (actor_id, session)
        if key not in self.sessions and len(self.sessions) >= MAX_SESSIONS:
            key = ("(too many sessions)", "")  # memory stays bounded whatever peers claim to be
        if key not in self.sessions:
            self.sessions[key] = SessionCount()
        return self.sessions[key]

    def close(self) -> None:
        self.sock.close(linger=0)


class WeightPublisher:
    """Learner side of the weight channel: PUB for broadcasts, ROUTER for newest-weights requests.

    A version travels as chunks under the message cap (streamrl.comm.chunks), sent zero-copy from the
    live parameters' own memory (or, for tensors ZeroMQ cannot read in place, copied into a small
    pool of reused buffers), so a publish holds at most the pool, never a copy of the model.
    `publish(..., wait=False)` sends on a background thread so the learner goes on with its next
    forward/backward meanwhile; `settle()` must come before anything changes the parameters (the
    optimizer step, loading a checkpoint): it waits until nothing sent still reads them (every
    in-place frame out, every pool copy made). Until then the parameters still are the published
    version, and a request is answered by sending it again from them; after it, requests wait for
    the next publish.

    An answer to a request is a re-broadcast on the PUB socket (the one thread that sends weights
    owns it; ZeroMQ sockets are not thread-safe, and the ROUTER belongs to the caller's thread):
    subscribers that hold the version skip its chunks without copying them, and requests that come
    while a version is on the way share one re-broadcast after it.
    """

    def __init__(self, ctx: zmq.Context, pub_addr: str, router_addr: str, max_bytes: int,
                 curve: Curve | None = None, chunk_bytes: int = chunks.DEFAULT_CHUNK_BYTES,
                 pool_chunks: int | None = None, stall_s: float = 10.0):
        """pool_chunks: chunk buffers a publish may hold (default: chunks.POOL_BYTES of them, at least 4)."""
        self.chunk_bytes = chunks.chunk_bytes_for(max_bytes, chunk_bytes)
        pool_chunks = pool_chunks or max(4, chunks.POOL_BYTES // self.chunk_bytes)
        self._ctx, self._curve = ctx, curve
        self.pool = chunks.ChunkPool(self.chunk_bytes, pool_chunks)
        self.stall_s = stall_s
        """How long a chunk may wait for a subscriber before the PUB socket is reopened (see _wait_sent)."""
        self.pub = self._new_pub()
        _bind(self.pub, pub_addr, "weight broadcast")
        self.router = _socket(ctx, zmq.ROUTER, max_bytes=64 * 1024, curve=curve)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 0)
        _bind(self.router, router_addr, "weights request server")
        self._layout: chunks.Layout | None = None
        self._live: tuple[int, dict] | None = None
        """(version, state) while `state` still holds that version (from publish to settle): requests are
        answered from it."""
        self._asked = 0  # requests waiting for a re-broadcast
        self.version = -1
        self.rejected = RejectCounter("weights request server")
        self.bytes_sent = 0
        self.requests_served = 0
        self.rebroadcasts = 0
        self.peers: set[bytes] = set()  # DEALER identities of actors that have asked for weights (bounded)
        self.actor_peers: dict[str, bytes] = {}  # actor_id -> its newest DEALER identity (eval requests go there)
        self.session = uuid.uuid4().hex[:12]  # this life of the learner, stamped on every broadcast
        self.closing: wire.Shutdown | None = None
        self.admit: Callable[[str, dict | None], str | None] | None = None
        """Given a request's actor_id and fingerprint: None to admit the actor, else one line why it is refused."""
        self.refused_actors: dict[str, str] = {}  # actor_id -> why (bounded like peers)
        self.settle_s = 0.0
        """Seconds callers spent in `settle` waiting for a background copy (time the learner was blocked)."""
        self.copy_s = 0.0
        """Seconds the copies into chunk buffers took (on the publishing thread when wait=False)."""
        self.send_wait_s = 0.0
        """Seconds the publishing thread waited for ZeroMQ to send chunks (in flight bound, in-place frames)."""
        self.reopened = 0
        """Times the PUB socket was reopened to release chunks a stalled subscriber held (see _wait_sent)."""
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="weights-publish")
        self._copied: threading.Event | None = None  # set when the pending job's last chunk is copied
        self._job: concurrent.futures.Future | None = None  # the pending copy-and-send
        self._error: BaseException | None = None  # a failed background copy, for `settle` to raise

    @property
    def latest(self) -> tuple[int, dict] | None:
        """(version, state) a request would be answered from now, or None (the parameters moved on)."""
        return self._live

    def publish(self, version: int, state: dict, broadcast: bool = True, wait: bool = True) -> int:
        """Broadcast `state` as `version`; returns the bytes of one copy.

        wait=True: the copy is done when this returns, so the caller may update its tensors at once.
        wait=False: the copy and the send run on a background thread and this returns at once; the
        caller must call `settle()` before it changes any tensor of `state`. broadcast=False only keeps
        it as the answer to requests (the collective sync carries it).
        """
        self._wait_copied()  # one job at a time: the previous version's copy is complete before this one starts
        layout = self._layout
        if layout is None or layout.key != tuple((n, t.dtype, tuple(t.shape)) for n, t in state.items()):
            layout = self._layout = chunks.Layout(state)
        self._live = (version, state)
        self.version = version
        if broadcast or self._asked:
            self._start(version, state)
        if wait:
            self._wait_copied()
        return layout.total

    def _start(self, version: int, state: dict) -> None:
        copied = threading.Event()
        self._copied = copied
        self._job = self._pool.submit(self._copy_and_send, version, state, self._layout, copied)
        self.requests_served += self._asked
        self._asked = 0
        self.bytes_sent += self._layout.total

    def _copy_and_send(self, version: int, state: dict, layout: chunks.Layout, copied: threading.Event) -> None:
        """On the publishing thread: each chunk sent zero-copy from the tensors' own memory (or, for
        tensors that cannot be sent in place, from a pool buffer it is copied into). `copied` is set
        once nothing sent refers to `state` any more: every copy made and every in-place frame sent.
        At most pool.size chunks are in flight (what a stalled subscriber can hold back)."""
        try:
            tensors = list(state.values())
            heads = chunks.headers(version, layout, self.chunk_bytes, self.session)
            in_flight: collections.deque[tuple[list, bool]] = collections.deque()  # (trackers, reads `state`)
            for h in heads:
                start = h.index * self.chunk_bytes
                end = min(start + self.chunk_bytes, layout.total)
                while len(in_flight) >= self.pool.size:
                    self._wait_sent(in_flight.popleft()[0])
                frames, pooled = chunks.pieces_of(layout, tensors, start, end), None
                if frames is None:
                    pooled, buf, reading = self.pool.take(end - start)
                    self._wait_sent(reading)
                    t0 = time.perf_counter()
                    chunks.copy_chunk(layout, tensors, start, buf)
                    self.copy_s += time.perf_counter() - t0
                    frames = [buf.numpy()]
                trackers = self._send_chunk(wire.encode_chunk_header(h), frames)
                for tracker in trackers if pooled is not None else ():
                    self.pool.track(pooled, tracker)
                in_flight.append((trackers, pooled is None))
            for trackers, reads_state in in_flight:  # the parameters may change once no frame reads them
                if reads_state:
                    self._wait_sent(trackers)  # chunk by chunk: `stall_s` is for one chunk, not the whole tail
        except BaseException as e:
            self._error = e  # raised by the caller's next settle
            raise
        finally:
            copied.set()

    def _send_chunk(self, header: bytes, frames: list) -> list:
        """Send one chunk message; returns the trackers of the frames sent zero-copy."""
        self.pub.send(header, zmq.SNDMORE)
        trackers = []
        for k, frame in enumerate(frames):
            flags = zmq.SNDMORE if k < len(frames) - 1 else 0
            if memoryview(frame).nbytes < chunks.ZERO_COPY_MIN:
                self.pub.send(frame, flags)
            else:
                trackers.append(self.pub.send(frame, flags, copy=False, track=True))
        return trackers

    def _wait_sent(self, trackers: list) -> None:
        """Wait until ZeroMQ is done with these frames. A subscriber that stays connected but stops
        reading (a stopped process) would keep them forever, and a frame that is a view of the live
        parameters must never go out after the optimizer changed them: after `stall_s` the PUB socket is
        closed (ZeroMQ drops what it still queues, so the frames are released) and bound again;
        subscribers reconnect and this version's partial chunks are dropped as `chunk_lost`."""
        t0 = time.perf_counter()
        deadline = t0 + self.stall_s
        try:
            for tracker in trackers:
                tracker.wait(max(0.0, deadline - time.perf_counter()))
        except zmq.NotDone:
            self._reopen_pub()
            for tracker in trackers:
                tracker.wait(self.stall_s)  # released by the close; NotDone here is a real failure
        finally:
            self.send_wait_s += time.perf_counter() - t0

    def _reopen_pub(self) -> None:
        addr = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        log.warning("weights: a chunk was not sent within %.0fs (a subscriber that stopped reading?); the "
                    "broadcast socket is reopened on %s so the parameters it sends from can change",
                    self.stall_s, addr)
        self.pub.close(linger=0)
        self.pub = self._new_pub()
        for attempt in range(50):  # the closed socket's port is freed by ZeroMQ's I/O thread, soon
            try:
                self.pub.bind(addr)
                break
            except zmq.ZMQError:
                if attempt == 49:
                    raise
                time.sleep(0.1)
        self.reopened += 1

    def _new_pub(self) -> zmq.Socket:
        pub = _socket(self._ctx, zmq.PUB, curve=self._curve)
        # No high-water mark: chunks in flight are bounded by their trackers (`_copy_and_send`), and a PUB
        # socket at its mark drops messages. The mark cannot stand in for that bound: the socket learns
        # that queued messages left only every (mark + 1) / 2 of them, so it drops at about half its mark
        # (a pool of 8 chunks under a mark of 12 lost chunks, and the version never completed).
        pub.setsockopt(zmq.SNDHWM, 0)
        return pub

    def _wait_copied(self) -> None:
        copied = self._copied
        if copied is None:
            return
        if not copied.is_set():
            t0 = time.perf_counter()
            copied.wait()
            self.settle_s += time.perf_counter() - t0
        self._copied = None
        if self._error is not None:  # a failed copy surfaces in the caller, not in a lost thread
            err, self._error, self._job = self._error, None, None
            raise err

    def settle(self) -> None:
        """Block until the pending publish has copied `state`; from here on the caller may change the
        parameters (call it before the optimizer step), and requests wait for the next publish."""
        self._wait_copied()
        self._live = None

    def flush(self) -> None:
        """Wait for the pending copy and its send (before the caller's thread uses the PUB socket)."""
        self._wait_copied()
        job, self._job = self._job, None
        if job is not None:
            job.result()

    def serve_requests(self) -> int:
        """Take every waiting WeightsRequest; returns how many were answered now (a re-broadcast of the
        newest version started; see the class docstring for when it waits)."""
        while True:
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            identity, body = frames[0], frames[1:]
            try:
                msg = wire.decode_header(body)
                if not isinstance(msg, wire.WeightsRequest):
                    raise wire.WireError("unexpected_type", f"expected weights_request, got {type(msg).__name__}")
            except wire.WireError as e:
                self.rejected(e)
                continue
            if self.admit is not None and (refusal := self.admit(msg.actor_id, msg.fingerprint)) is not None:
                if msg.actor_id not in self.refused_actors and len(self.refused_actors) < MAX_SESSIONS:
                    self.refused_actors[msg.actor_id] = refusal
                    log.error("refused %s: %s", msg.actor_id, refusal)
                self.rejected.counts["fingerprint_mismatch"] += 1
                self.router.send_multipart([identity, *wire.encode(wire.Shutdown(reason=wire.REFUSED + refusal))],
                                           copy=False)
                continue
            if len(self.peers) < MAX_SESSIONS:
                self.peers.add(bytes(identity.buffer))
                self.actor_peers[msg.actor_id] = bytes(identity.buffer)
            if self.closing is not None:  # an actor joining while the learner shuts down: tell it to stop
                self.router.send_multipart([identity, *wire.encode(self.closing)], copy=False)
            else:
                self._asked += 1
        busy = self._job is not None and not self._job.done()
        if not self._asked or busy or self._live is None or self.closing is not None:
            return 0
        served = self._asked
        self._wait_copied()  # surfaces a failed previous job
        self._job = None
        self.rebroadcasts += 1
        self._start(*self._live)
        return served

    def announce(self, msg: wire.WeightsCollective) -> None:
        """Tell subscribers a version follows over the collective group (they join the broadcast)."""
        self.flush()
        self.pub.send_multipart(wire.encode(msg))

    def send_to(self, actor_id: str, msg: wire.EvalRequest) -> bool:
        """A notice to one actor (by the id its weight requests gave); False if it never asked or cannot take it."""
        peer = self.actor_peers.get(actor_id)
        if peer is None:
            return False
        try:
            self.router.send_multipart([peer, *wire.encode(msg)], zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def demand(self, version: int, groups_missing: int) -> None:
        self._notify(wire.Demand(version=version, groups_missing=groups_missing))

    def shutdown(self, reason: str = "done") -> None:
        self.flush()
        self.closing = wire.Shutdown(reason=reason)  # from now on a request is answered with this
        self._notify(self.closing)
        self.pub.send_multipart(wire.encode(wire.Shutdown(reason=reason)))  # also reaches an actor that never asked

    def _notify(self, msg) -> None:
        frames = wire.encode(msg)
        for peer in self.peers:  # a peer that has gone away is dropped silently (not ROUTER_MANDATORY)
            try:
                self.router.send_multipart([peer, *frames], zmq.NOBLOCK)
            except zmq.Again:
                pass

    def close(self, linger_ms: int = 500) -> None:
        """Give queued notices (the shutdown above all) up to `linger_ms` to leave."""
        try:
            self.flush()
        except Exception:  # a failed last copy must not keep the sockets open
            log.exception("the last weight publish failed")
        self._pool.shutdown(wait=True)
        self.pub.close(linger=linger_ms)
        self.router.close(linger=linger_ms)


def _on_host(got: tuple[int, dict]) -> tuple[int, dict]:
    """A version to keep aside: frames as received (host memory already), or a collective's device tensors copied
    to the host (a second copy of the weights must not sit in the engine's device memory until the next one)."""
    if isinstance(got[1], chunks.Received) or all(t.device.type == "cpu" for t in got[1].values()):
        return got
    return got[0], {name: t.to("cpu") for name, t in got[1].items()}


class WeightSubscriber:
    """Actor side of the weight channel: SUB for broadcasts, DEALER to ask for the newest weights.

    `poll` returns the newest version waiting (older ones are skipped), so an actor that fell
    behind jumps straight to the current policy. A version comes as chunks (streamrl.comm.chunks) and is
    returned only once all of them have arrived and agree; a version whose chunks stop coming (a
    newer one starts, a chunk was lost) is dropped and counted (`chunk_lost`), and chunks of a
    version already held are skipped without a copy.
    """

    def __init__(self, ctx: zmq.Context, pub_addr: str, router_addr: str, actor_id: str, max_bytes: int,
                 curve: Curve | None = None,
                 collective: Callable[[wire.WeightsCollective], dict | None] | None = None,
                 max_version_bytes: int = 1 << 40):
        self.collective = collective
        """Takes an announced collective sync and returns its tensors, or None (then ask the ROUTER)."""
        self.sub = _socket(ctx, zmq.SUB, max_bytes, curve)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(pub_addr)
        self.dealer = _socket(ctx, zmq.DEALER, max_bytes, curve)
        self.dealer.connect(router_addr)
        self.actor_id = actor_id
        self.rejected = RejectCounter(f"weight subscriber {actor_id}")
        self.shutdown: wire.Shutdown | None = None
        self.demand: wire.Demand | None = None
        self.eval_requests: collections.deque[wire.EvalRequest] = collections.deque(maxlen=1000)
        """The learner's eval requests to this actor, oldest first (the actor takes them between generate calls)."""
        self.keep: Callable[[int], bool] | None = None
        """Versions to keep aside as they arrive (the ones due for evaluation), even when a newer one follows."""
        self.kept: tuple[int, dict] | None = None
        """The newest version `keep` chose: an eval request for it can be answered after the actor moved on."""
        self.fingerprint: dict | None = None  # sent with every request: the learner's handshake
        self.learner: str | None = None  # the learner life whose weights we hold
        self.learner_restarts = 0
        self.max_version_bytes = max_version_bytes
        """The largest version (bytes) this subscriber allocates room for."""
        self._newest: tuple[int, dict] | None = None
        self._held = -1  # newest version taken in from the current learner life (its chunks are skipped)
        self._assembly: chunks.Assembly | None = None
        self.last_chunk = 0.0
        """time.monotonic() of the last chunk taken in: a version is on its way, no need to ask again."""
        self.poller = zmq.Poller()
        self.poller.register(self.sub, zmq.POLLIN)
        self.poller.register(self.dealer, zmq.POLLIN)

    def request(self, have_version: int) -> None:
        """Ask for the newest weights; dropped if no learner connection can take it now (it is asked again)."""
        try:
            self.dealer.send_multipart(wire.encode(wire.WeightsRequest(
                actor_id=self.actor_id, have_version=have_version, fingerprint=self.fingerprint)), zmq.NOBLOCK)
        except zmq.Again:
            pass

    def watch(self, timeout_ms: int = 0) -> None:
        """Take in whatever arrived within `timeout_ms`: notices, and the newest weights (kept for `poll`)."""
        events = dict(self.poller.poll(timeout_ms))
        while events:
            for sock in (self.sub, self.dealer):
                if sock not in events:
                    continue
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    got = self._decode(frames)
                    if got is not None and self.keep is not None and self.keep(got[0]):
                        self.kept = _on_host(got)
                    if got is not None and (self._newest is None or got[0] > self._newest[0]):
                        self._newest = got
            events = dict(self.poller.poll(0))

    def poll(self, timeout_ms: int = 0) -> tuple[int, dict] | None:
        """Newest (version, tensors) received and not yet returned, waiting up to `timeout_ms`."""
        self.watch(timeout_ms)
        got, self._newest = self._newest, None
        return got

    def wait_for(self, min_version: int, timeout_s: float, ask_first: bool = False, ask_every_s: float = 1.0,
                 stop: Callable[[], bool] = lambda: False, evals_wake: bool = True) -> tuple[int, dict] | None:
        """Block until weights with version ≥ min_version arrive.

        A joining actor asks the ROUTER at once (`ask_first`); otherwise the broadcast normally
        brings the version, and the ROUTER is asked only if nothing came for `ask_every_s` (a
        missed broadcast). Returns None if a Shutdown arrived, `stop()` became true, the
        learner asked for more groups at the version before `min_version` (see `take_demand`), or
        (evals_wake) it asked this actor for an evaluation (see `eval_requests`); raises TimeoutError after `timeout_s` with what it waited for.
        """
        deadline = time.monotonic() + timeout_s
        if ask_first:
            self.request(min_version - 1)
        next_ask = time.monotonic() + ask_every_s
        best: tuple[int, dict] | None = None
        restarts = self.learner_restarts
        while True:
            got = self.poll(timeout_ms=100)
            if got is not None and self.learner_restarts != restarts:
                return got  # a restarted learner resumed at a version of its own: take it, whatever it is
            if got is not None and (best is None or got[0] > best[0]):
                best = got
            if best is not None and best[0] >= min_version:
                return best
            if self.shutdown is not None or stop() or self._demanded(min_version - 1) or \
                    (evals_wake and self.eval_requests):
                return None
            now = time.monotonic()
            if self.last_chunk > now - ask_every_s:  # a version is arriving: asking again would resend it
                next_ask = max(next_ask, self.last_chunk + ask_every_s)
            if now > deadline:
                raise TimeoutError(
                    f"actor {self.actor_id}: no weights with version >= {min_version} from the learner "
                    f"in {timeout_s:.0f}s (newest seen: {best[0] if best else 'none'}); is the learner alive?"
                )
            if now > next_ask:
                self.request(min_version - 1)
                next_ask = now + ask_every_s

    def rewind(self, version: int) -> None:
        """The caller went back to `version` (an evaluation): newer versions are taken in again, and the newest is
        asked for now."""
        self._held = min(self._held, version)
        self.request(version)

    def _demanded(self, version: int) -> bool:
        return self.demand is not None and self.demand.version == version

    def take_demand(self, version: int) -> wire.Demand | None:
        """The learner's request for more groups made at `version`, once."""
        if not self._demanded(version):
            return None
        d, self.demand = self.demand, None
        return d

    def _decode(self, frames) -> tuple[int, dict] | None:
        try:
            header = wire.decode_header(frames)
            if isinstance(header, wire.Shutdown):
                self.shutdown = header
                return None
            if isinstance(header, wire.Demand):
                if self.demand is None or header.version >= self.demand.version:
                    self.demand = header
                return None
            if isinstance(header, wire.EvalRequest):
                self.eval_requests.append(header)
                return None
            if isinstance(header, wire.WeightsCollective):
                # The group is the learner life this actor joined it with (or its first weights come
                # this way); a restarted learner's announcement means the old group is gone.
                same_life = self.learner in (None, header.learner)
                tensors = self.collective(header) if self.collective and same_life else None
                if tensors is None:  # not (or no longer) in the group: the ROUTER has the same version
                    self.collective = None
                    self.request(header.version - 1)
                    return None
                got = (header.version, tensors)
            elif isinstance(header, wire.WeightsChunk):
                got = self._chunk(frames, header)
                if got is None:
                    return None
            else:
                raise wire.WireError("unexpected_type", f"expected weights, got {type(header).__name__}")
        except wire.WireError as e:
            self.rejected(e)
            return None
        if header.learner != self.learner:
            if self.learner is not None:
                log.warning("actor %s: the learner restarted (now at version %d); resyncing to it",
                            self.actor_id, got[0])
                self.learner_restarts += 1
                self._newest = None  # versions of the old learner life are not comparable
            self.learner = header.learner
            self._held = -1
        self._held = max(self._held, got[0])
        return got

    def _chunk(self, frames, header: wire.WeightsChunk) -> tuple[int, dict] | None:
        """Take one chunk; the version's (version, tensors) once its last chunk is in, else None."""
        payload = wire.chunk_payload(frames, header)
        if header.learner == self.learner and header.version <= self._held:
            return None  # a version we have (re-sent for another subscriber that asked)
        self.last_chunk = time.monotonic()
        a = self._assembly
        if a is None or (a.learner, a.version) != (header.learner, header.version):
            if a is not None and a.learner == header.learner and header.version < a.version:
                return None  # an older version re-sent while a newer one is under way
            self._assembly = None
            if a is not None:  # a newer version (or learner life) started: the old one's chunks are gone
                self.rejected(wire.WireError(
                    "chunk_lost", f"weights version {a.version}: {a.missing} of {a.count} chunks never came "
                    f"(version {header.version} began); the version is dropped"))
            a = self._assembly = chunks.Assembly(header, self.max_version_bytes)
        a.add(header, payload)
        if not a.complete:
            return None
        self._assembly = None
        return a.version, a.tensors()

    def close(self) -> None:
        self.sub.close(linger=0)
        self.dealer.close(linger=0)
