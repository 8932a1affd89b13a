"""The weight channel's actor end: versions SUBscribed to and put together from their chunks
(streamrl.comm.weights.assembly); the learner end is streamrl.comm.weights.publisher.

The newest weights are asked for, and notices kept, by the actor's control-channel `Inbox`
(streamrl.comm.control), whose socket the subscriber watches beside its own: one wait wakes on either.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np
import zmq

from streamrl.comm import wire
from streamrl.comm.control import Inbox
from streamrl.comm.security import Curve
from streamrl.comm.sockets import make
from streamrl.comm.weights import assembly, chunks, encoders

log = logging.getLogger(__name__)

ASK_AGAIN = frozenset({"weights_checksum", "delta_base", "delta_corrupt", "delta_checksum", "ipc_manifest"})
"""Why a version that arrived is refused and asked for again (in full): its bytes were damaged on the way, or a
delta does not apply to the base held, or an IPC manifest was damaged. One rule for every way a version comes."""

Announced = wire.WeightsCollective | wire.WeightsIpc
"""A version announced on this channel that comes another way (`WeightSubscriber.sync` takes it)."""


def _on_host(got: tuple[int, dict]) -> tuple[int, dict]:
    """A version to keep aside: frames as received (host memory already), or a collective's (or IPC's) device tensors
    copied to the host (a second copy of the weights must not sit in the engine's device memory until the next one)."""
    if isinstance(got[1], assembly.Received) or all(t.device.type == "cpu" for t in got[1].values()):
        return got
    return got[0], {name: t.to("cpu") for name, t in got[1].items()}


class WeightSubscriber:
    """Actor side of the weight channel: SUB for broadcasts; the newest weights are asked for, and notices
    kept, by its `inbox` (streamrl.comm.control), whose socket it watches beside its own.

    `poll` returns the newest version waiting (older ones are skipped), so an actor that fell
    behind jumps straight to the current policy. A version comes as chunks (streamrl.comm.weights.chunks) and is
    returned only once all of them have arrived and agree; a version whose chunks stop coming (a
    newer one starts, a chunk was lost) is dropped and counted (`chunk_lost`), and chunks of a
    version already held are skipped without a copy.
    """

    def __init__(self, ctx: zmq.Context, pub_addr: str, inbox: Inbox, max_bytes: int, curve: Curve | None = None,
                 sync: Callable[[Announced], dict | None] | None = None,
                 max_version_bytes: int = 1 << 40, keep_base: bool = False):
        """keep_base: keep the bytes of the version last taken in, the base a delta version is applied to
        (transport.weights_delta on or auto; without it a delta is refused and a full version asked for)."""
        self.sync = sync
        """Takes a version announced for another way (the collective group, CUDA IPC) and returns its tensors, or
        None (then it is asked for on the ROUTER, and that way is left for good)."""
        self.sub = make(ctx, zmq.SUB, max_bytes, curve)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(pub_addr)
        self.inbox = inbox
        self.actor_id = inbox.actor_id
        self.rejected = inbox.rejected  # one tally of what the learner's side sent this actor that was refused
        inbox.other = self._take
        self.keep: Callable[[int], bool] | None = None
        """Versions to keep aside as they arrive (the ones due for evaluation), even when a newer one follows."""
        self.kept: tuple[int, dict] | None = None
        """The newest version `keep` chose: an eval request for it can be answered after the actor moved on."""
        self.learner: str | None = None  # the learner life whose weights we hold
        self.learner_restarts = 0
        self.max_version_bytes = max_version_bytes
        """The largest version (bytes) this subscriber allocates room for."""
        self._newest: tuple[int, dict] | None = None
        self._held = -1  # newest version taken in from the current learner life (its chunks are skipped)
        self._assembly: assembly.Assembly | None = None
        self.keep_base = keep_base
        self._base: tuple[str, int, list] | None = None
        """(learner, version, each chunk's received pieces) of the version last taken in, with keep_base."""
        self._asked_full: tuple[str, int] | None = None
        """(learner, version) of the last delta dropped for want of any base: one request per version, not chunk."""
        self.deltas = self.fulls = 0
        """Versions taken in as deltas and in full."""
        self.last_chunk = 0.0
        """time.monotonic() of the last chunk taken in: a version is on its way, no need to ask again."""
        self.poller = zmq.Poller()
        self.poller.register(self.sub, zmq.POLLIN)
        self.poller.register(inbox.sock, zmq.POLLIN)

    def request(self, have_version: int) -> None:
        """Ask for the newest weights, telling the learner `have_version`, or the base this subscriber holds for a
        delta where that is older (none: -1). The learner sends the next version as a delta to an asker only if it
        holds that delta's base, so the claim must never be newer than the base: a caller's "I have min_version - 1"
        (`wait_for`, `hold`) or the version last assembled (a collective one sets no base) may be."""
        self.inbox.request(min(have_version, self._base_version()))

    def _base_version(self) -> int:
        """The version whose bytes a delta from the current learner life can be applied to, or -1."""
        base = self._base
        return base[1] if self.keep_base and base is not None and base[0] == self.learner else -1

    def watch(self, timeout_ms: int = 0) -> None:
        """Take in whatever arrived within `timeout_ms`: notices, and the newest weights (kept for `poll`)."""
        events = dict(self.poller.poll(timeout_ms))
        while events:
            if self.inbox.sock in events:
                self.inbox.receive()
            while self.sub in events:
                try:
                    frames = self.sub.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self._take(frames)
            events = dict(self.poller.poll(0))

    def _take(self, frames, header: wire.Header | None = None) -> None:
        got = self._decode(frames, header)
        if got is not None and self.keep is not None and self.keep(got[0]):
            self.kept = _on_host(got)
        if got is not None and (self._newest is None or got[0] > self._newest[0]):
            self._newest = got

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
        learner asked for more groups at the version before `min_version` (see `Inbox.take_demand`), or
        (evals_wake) it asked this actor for an evaluation (see `Inbox.eval_requests`); raises TimeoutError
        after `timeout_s` with what it waited for.
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
            inbox = self.inbox
            if inbox.shutdown is not None or stop() or inbox.demanded(min_version - 1) or \
                    (evals_wake and inbox.eval_requests):
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

    def _decode(self, frames, header: wire.Header | None = None) -> tuple[int, dict] | None:
        try:
            header = header or wire.decode_header(frames)
            if self.inbox.note(header):  # a shutdown broadcast
                return None
            if isinstance(header, (wire.WeightsCollective, wire.WeightsIpc)):
                got = self._announced(header)
                if got is None:
                    return None
            elif isinstance(header, wire.WeightsChunk):
                got = self._chunk(frames, header, chunks.chunk_payload(frames, header))
                if got is None:
                    return None
                self.fulls += 1
            elif isinstance(header, wire.WeightsDelta):
                got = self._delta(frames, header)
                if got is None:
                    return None
                header = header.layout
                self.deltas += 1
            else:
                raise wire.WireError("unexpected_type", f"expected weights, got {type(header).__name__}")
        except wire.WireError as e:
            self.rejected(e)
            if e.reason in ASK_AGAIN:  # the version came damaged: what there is of it goes, and it is asked for again
                self._assembly = None
                self.request(self._held)  # in full: the learner sends one to an asker holding an older base
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

    def _announced(self, header: Announced) -> tuple[int, dict] | None:
        """A version that comes another way, taken through `sync`; asked for on the ROUTER when that fails."""
        if isinstance(header, wire.WeightsIpc) and header.learner == self.learner and header.version <= self._held:
            return None  # stale: a newer version is held (a collective one cannot be skipped: the group waits)
        # The group is the learner life this actor joined it with (or its first weights come this way); a
        # restarted learner's announcement means the old group is gone (an IPC handle opens the same either way).
        same_life = self.learner in (None, header.learner) or isinstance(header, wire.WeightsIpc)
        tensors = self.sync(header) if self.sync and same_life else None
        if tensors is None:  # not (or no longer) that way: the ROUTER has the same version
            self.sync = None
            self.request(header.version - 1)
            return None
        return header.version, tensors

    def _delta(self, frames, d: wire.WeightsDelta) -> tuple[int, dict] | None:
        """Take one delta chunk: the new chunk made from the base and checked, then taken in as `_chunk` takes a
        full one. A delta this subscriber cannot apply (another base, bytes that do not check) raises WireError:
        `_decode` drops the version and asks for it in full (ASK_AGAIN; the learner sends one to an asker that lacks
        the base)."""
        h = d.layout
        if h.learner == self.learner and h.version <= self._held:
            return None
        if len(frames) != 2:
            raise wire.WireError("frame_count", f"weights delta chunk needs 2 frames, got {len(frames)}")
        base = self._base
        if base is None or base[0] != h.learner:
            # No version of this learner life held yet: a subscriber that just joined (or whose learner restarted)
            # sees the deltas broadcast before the full version it asked for comes. PUB/SUB cannot keep them from
            # it, and the learner sent them to those holding their base, not to it: not a refusal. The version is
            # dropped and a full one asked for (the learner sends one to an asker that holds no base).
            if self._asked_full != (h.learner, h.version):
                self._asked_full = (h.learner, h.version)
                self.request(-1)
            return None
        if (base[0], base[1]) != (h.learner, d.base) or len(base[2]) != h.count:
            raise wire.WireError("delta_base", f"weights version {h.version} is a delta from version {d.base}, "
                                 f"this actor holds {base[1]}")
        old = base[2][h.index]
        old = np.frombuffer(old[0], np.uint8) if len(old) == 1 else \
            np.concatenate([np.frombuffer(b, np.uint8) for b in old])
        new = encoders.apply(wire.buffer(frames[1]), old, d)
        return self._chunk(frames, h, [memoryview(new)], checked=True)

    def _chunk(self, frames, header: wire.WeightsChunk, payload: list,
               checked: bool = False) -> tuple[int, dict] | None:
        """Take one chunk (its bytes checked against its checksum unless `checked`: a delta's); the version's
        (version, tensors) once its last chunk is in, else None."""
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
            a = self._assembly = assembly.Assembly(header, self.max_version_bytes)
        a.add(header, payload, checked)
        if not a.complete:
            return None
        self._assembly = None
        if self.keep_base:
            self._base = (a.learner, a.version, a.payloads)
        return a.version, a.tensors()

    def close(self) -> None:
        """Closes the subscriber's own socket; the inbox is closed by its owner."""
        self.sub.close(linger=0)
