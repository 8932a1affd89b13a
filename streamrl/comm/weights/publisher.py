"""The weight channel's learner end: each new version PUBlished as chunks (streamrl.comm.weights.chunks), the way
its encoder (streamrl.comm.weights.encoders) makes them.

Actors SUBscribe (streamrl.comm.weights.subscriber). A late or lagging actor asks for the newest weights on
the control channel (streamrl.comm.control), which answers with a re-broadcast here.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
import uuid

import zmq

from streamrl.comm import wire
from streamrl.comm.security import Curve
from streamrl.comm.sockets import bind, make
from streamrl.comm.weights import chunks, encoders

log = logging.getLogger(__name__)

SLOW_LINK_BYTES_S = 12.5e6
"""100 Mbit/s: the slowest link a send is waited for chunk by chunk once a newer version is waiting for it."""


class WeightPublisher:
    """Learner side of the weight channel: PUB for broadcasts (requests come on streamrl.comm.control).

    A version travels as chunks under the message cap (streamrl.comm.weights.chunks), sent zero-copy from the
    live parameters' own memory (or, for tensors ZeroMQ cannot read in place, copied into a small
    pool of reused buffers), so a publish holds at most the pool, never a copy of the model.
    `publish(..., wait=False)` sends on a background thread so the learner goes on with its next
    forward/backward meanwhile; `settle()` must come before anything changes the parameters (the
    optimizer step, loading a checkpoint): it waits until nothing sent still reads them (every
    in-place frame out, every pool copy made). Until then the parameters still are the published
    version, and a request is answered by sending it again from them; after it, requests wait for
    the next publish.

    The encoder (transport.weights_delta: streamrl.comm.weights.encoders) makes and sends each version. A detached
    one (deltas, or a host copy) copies every version off the parameters into host memory before it is sent, so the
    learner need not wait for the network: a version whose send has not begun when `settle` comes (the one before it
    still on its way: a slow link, or a slow or dead subscriber holding the broadcast) is skipped, not waited for, up
    to the encoder's `run_ahead` versions past the one being sent, and the next goes from the last one sent (`skipped`
    counts them); a subscriber that missed a version asks, as after any gap. Otherwise chunks are sent
    from the parameters themselves, and `settle` waits until they are out. Either way a send that a subscriber
    holds up (it stopped reading: a dead link, a stopped process) is given up after `superseded_stall_s` without
    progress once the learner or a newer version waits for it (`stall_s` otherwise): the PUB socket is reopened,
    which drops that subscriber until it reconnects and asks.

    An answer to a request (`ask`, then `answer`) is a re-broadcast on the PUB socket (the one thread
    that sends weights owns it; ZeroMQ sockets are not thread-safe):
    subscribers that hold the version skip its chunks without copying them, and requests that come
    while a version is on the way share one re-broadcast after it.
    """

    def __init__(self, ctx: zmq.Context, pub_addr: str, max_bytes: int,
                 curve: Curve | None = None, chunk_bytes: int = chunks.DEFAULT_CHUNK_BYTES,
                 pool_chunks: int | None = None, stall_s: float = 10.0, delta_mode: str = "off",
                 full_every: int = 20, encoder: encoders.Encoder | None = None, host_copy: int | None = None):
        """pool_chunks: chunk buffers a publish may hold (default: chunks.POOL_BYTES of them, at least 4);
        delta_mode, full_every, host_copy: transport.weights_delta, weights_delta_full_every and the versions a host
        copy may skip (None: none made), which pick the encoder (encoders.make) unless one is given."""
        self.chunk_bytes = chunks.chunk_bytes_for(max_bytes, chunk_bytes)
        pool_chunks = pool_chunks or max(4, chunks.POOL_BYTES // self.chunk_bytes)
        self._ctx, self._curve = ctx, curve
        self.pool = chunks.ChunkPool(self.chunk_bytes, pool_chunks)
        self.stall_s = stall_s
        """How long a send may go without a chunk leaving before the PUB socket is reopened (see wait_sent)."""
        self.superseded_stall_s = min(1.0, stall_s)
        """The same, plus one chunk's time at SLOW_LINK_BYTES_S, once a newer version waits for this send: then a
        peer that takes nothing holds up every other one's newer weights, not only this version."""
        self._superseded = threading.Event()  # set when a newer version is queued behind the send going on
        self._chunk_s = 0.0  # one chunk of the send going on at SLOW_LINK_BYTES_S
        self.pub = self._new_pub()
        bind(self.pub, pub_addr, "weight broadcast")
        self._layout: chunks.Layout | None = None
        self._live: tuple[int, dict] | None = None
        """(version, state) while `state` still holds that version (from publish to settle): requests are
        answered from it."""
        self._asked = 0  # requests waiting for a re-broadcast
        self._asked_have = 1 << 62  # the oldest version those requests hold: a delta from a newer base is no use
        self.encoder: encoders.Encoder = encoder or encoders.make(delta_mode, full_every, host_copy)
        """How each version goes on the wire: in full, or as deltas from the previous one (a host copy of it)."""
        self.version = -1
        self.sent = {"full": 0, "delta": 0}
        """Bytes put on the broadcast socket (one copy), by how the versions went: in full (re-broadcasts included)
        or as deltas. Counted once a version's messages are made, before they leave."""
        self.requests_served = 0
        self.rebroadcasts = 0
        self.session = uuid.uuid4().hex[:12]  # this life of the learner, stamped on every broadcast
        self.settle_s = 0.0
        """Seconds callers spent in `settle` waiting for a background copy (time the learner was blocked)."""
        self.copy_s = 0.0
        """Seconds the copies into chunk buffers took (on the publishing thread when wait=False)."""
        self.send_wait_s = 0.0
        """Seconds the publishing thread waited for ZeroMQ to send chunks (in flight bound, in-place frames)."""
        self.reopened = 0
        """Times the PUB socket was reopened to release chunks a stalled subscriber held (see wait_sent)."""
        self.skipped = 0
        """Versions not broadcast because the one before was still being sent when `settle` came (a detached
        encoder)."""
        self.settle_max_s = 0.0
        """The longest one `settle` waited (the learner's worst step for publishing)."""
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="weights-publish")
        self._copied: threading.Event | None = None  # set when the pending job's last chunk is copied
        self._job: concurrent.futures.Future | None = None  # the pending copy-and-send
        self._sending: concurrent.futures.Future | None = None  # the job before the pending one (maybe still sending)
        self._job_version = self._sending_version = -1  # the versions those two carry
        self._job_asked = (0, 1 << 62)  # the requests the pending job answers (given back if it is skipped)
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
            self._start(version, state, fresh=True)
        else:  # this version went another way: the next delta would have the wrong base
            self.encoder.reset()
        if wait:
            self._wait_copied()
        return layout.total

    def _start(self, version: int, state: dict, fresh: bool = False) -> None:
        """fresh: a new version (a delta may carry it); else a re-broadcast, always full."""
        copied = threading.Event()
        self._copied = copied
        self._sending, self._sending_version, self._job_version = self._job, self._job_version, version
        if fresh and self._sending is not None and not self._sending.done():
            self._superseded.set()  # the send going on is of an older version (a step behind already)
        send = self.encoder.job(self, version, state, self._layout, copied, fresh, self._asked_have)
        self._job = self._pool.submit(self._run, self._layout, send)
        self.requests_served += self._asked
        self._job_asked = (self._asked, self._asked_have)
        self._asked, self._asked_have = 0, 1 << 62

    def _run(self, layout: chunks.Layout, send) -> None:
        """On the publishing thread: one of the encoder's sends."""
        self._begin(layout)
        try:
            send()
        except BaseException as e:
            self._error = e  # raised by the caller's next settle
            raise

    def send_chunk(self, header: bytes, frames: list) -> list:
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

    def _begin(self, layout: chunks.Layout) -> None:
        """A send starts (on the publishing thread): no newer version waits for it yet."""
        self._superseded.clear()
        self._chunk_s = min(self.chunk_bytes, layout.total) / SLOW_LINK_BYTES_S

    def wait_sent(self, trackers: list) -> None:
        """Wait until ZeroMQ is done with these frames. A subscriber that stays connected but stops
        reading (a dead link, a stopped process) would keep them forever, and a frame that is a view of the live
        parameters must never go out after the optimizer changed them: after `stall_s` without a frame released
        (`superseded_stall_s` once a newer version waits) the PUB socket is closed (ZeroMQ drops what it still
        queues, so the frames are released) and bound again; subscribers reconnect and this version's partial
        chunks are dropped as `chunk_lost`. A slow subscriber that still takes chunks is waited for."""
        t0 = last = time.perf_counter()
        try:
            for tracker in trackers:
                while not tracker.done:
                    limit = self._stall_limit()
                    if time.perf_counter() - last > limit:
                        raise zmq.NotDone
                    try:
                        tracker.wait(0.1)
                    except zmq.NotDone:
                        # A socket handles its peers' comings and goings only when called: a subscriber gone
                        # (closed, killed) lets go of the chunks it held only once this socket is asked something.
                        self.pub.getsockopt(zmq.EVENTS)
                last = time.perf_counter()
        except zmq.NotDone:
            self._reopen_pub()
            for tracker in trackers:
                tracker.wait(self.stall_s)  # released by the close; NotDone here is a real failure
        finally:
            self.send_wait_s += time.perf_counter() - t0

    def _stall_limit(self) -> float:
        if self._superseded.is_set():
            return min(self.stall_s, self.superseded_stall_s + self._chunk_s)
        return self.stall_s

    def _reopen_pub(self) -> None:
        addr = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        log.warning("weights: no chunk left within %.0fs%s (a subscriber that stopped reading?); the broadcast "
                    "socket is reopened on %s", self._stall_limit(),
                    ", a newer version waiting" if self._superseded.is_set() else "", addr)
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
        pub = make(self._ctx, zmq.PUB, curve=self._curve)
        # No high-water mark: chunks in flight are bounded by their trackers (`encoders.send_state`), and a PUB
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
        parameters (call it before the optimizer step), and requests wait for the next publish. With a detached
        encoder, a version whose copy has not begun (the one before it is still being sent) is skipped instead, as
        long as it is at most the encoder's `run_ahead` versions past the one being sent."""
        t0 = time.perf_counter()
        job = self._job
        behind = self._sending is not None and not self._sending.done()  # queued behind a send still going
        bound = self.encoder.run_ahead
        within = bound is None or self._job_version - self._sending_version <= bound
        skip = self.encoder.detached and job is not None and self._copied is not None and behind and within
        if skip and job.cancel():
            self.skipped += 1
            self._superseded.set()
            self._copied, self._job = None, self._sending  # that one, maybe still on its way, is the pending job
            self._job_version = self._sending_version
            self.requests_served -= self._job_asked[0]  # those requests are answered by a later send
            self._asked += self._job_asked[0]
            self._asked_have = min(self._asked_have, self._job_asked[1])
        if self._copied is not None and not self._copied.is_set():
            self._superseded.set()  # the learner itself waits for this send (chunks sent from its parameters)
        self._wait_copied()
        self._live = None
        self.settle_max_s = max(self.settle_max_s, time.perf_counter() - t0)

    def flush(self) -> None:
        """Wait for the pending copy and its send (before the caller's thread uses the PUB socket)."""
        self._wait_copied()
        job, self._job = self._job, None
        if job is not None and not job.cancelled():
            job.result()

    def report(self) -> dict:
        """For the run's summary: the encoder's record (with deltas: versions and bytes each way, versions skipped)."""
        return self.encoder.report(self.skipped)

    def ask(self, have_version: int = -1) -> None:
        """One more actor, holding `have_version`, asked for the newest weights (answered by `answer`)."""
        self._asked += 1
        self._asked_have = min(self._asked_have, have_version)

    def answer(self) -> int:
        """Re-broadcast the newest version for the requests asked since the last send; returns how many that
        answered now (0 while a version is on its way, or from `settle` until the next publish)."""
        busy = self._job is not None and not self._job.done()
        if not self._asked or busy or self._live is None:
            return 0
        served = self._asked
        self._wait_copied()  # surfaces a failed previous job
        self._job = None
        self.rebroadcasts += 1
        self._start(*self._live)
        return served

    def broadcast(self, msg: wire.Shutdown) -> None:
        """A notice on the broadcast socket, after any version on its way: it reaches an actor that never asked."""
        self.flush()
        self.pub.send_multipart(wire.encode(msg))

    def announce(self, msg: wire.WeightsCollective) -> None:
        """Tell subscribers a version follows over the collective group (they join the broadcast)."""
        self.flush()
        self.pub.send_multipart(wire.encode(msg))

    def close(self, linger_ms: int = 500) -> None:
        """Give a queued shutdown notice up to `linger_ms` to leave."""
        try:
            self.flush()
        except Exception:  # a failed last copy must not keep the sockets open
            log.exception("the last weight publish failed")
        self._pool.shutdown(wait=True)
        self.pub.close(linger=linger_ms)
