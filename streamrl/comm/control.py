"""The control channel: actors' DEALERs ask, the learner's ROUTER answers and notifies.

Up: an actor asks for the newest weights (WeightsRequest, carrying its fingerprint: the learner's
admission), and acknowledges a version it took over CUDA IPC (WeightsIpcAck). Down, to each actor that asked:
Demand, Pace, Shutdown and EvalRequest. These notices go through the ROUTER rather than the weight broadcast
because PUB drops messages when a subscriber's small queue is full of weights, and a notice must not be lost. A
weight request is answered on the weight channel itself (a re-broadcast, `WeightPublisher.answer`), never here.
"""

from __future__ import annotations

import collections
import logging
from typing import Callable

import zmq

from streamrl.comm import wire
from streamrl.comm.security import Curve
from streamrl.comm.sockets import RejectCounter, bind, make
from streamrl.comm.weights.publisher import WeightPublisher

log = logging.getLogger(__name__)

MAX_PEERS = 10_000  # memory stays bounded whatever peers claim to be


class ControlServer:
    """Learner end (ROUTER, binds). `serve` takes every waiting request; the learner's one poller calls it."""

    def __init__(self, ctx: zmq.Context, addr: str, publisher: WeightPublisher, curve: Curve | None = None):
        self.publisher = publisher
        self.sock = make(ctx, zmq.ROUTER, max_bytes=64 * 1024, curve=curve)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        bind(self.sock, addr, "weights request server")
        self.rejected = RejectCounter("weights request server")
        self.peers: set[bytes] = set()  # DEALER identities of actors that have asked for weights
        self.actor_peers: dict[str, bytes] = {}  # actor_id -> its newest DEALER identity (eval requests go there)
        self.closing: wire.Shutdown | None = None
        self.admit: Callable[[str, dict | None], str | None] | None = None
        """Given a request's actor_id and fingerprint: None to admit the actor, else one line why it is refused."""
        self.refused_actors: dict[str, str] = {}  # actor_id -> why
        self.pacing: wire.Pace | None = None  # the newest Pace sent (`pace`)
        self.dealer: Callable[[wire.PromptsRequest, zmq.Frame], wire.Deal] | None = None
        """task.epochs: the learner's dealer, answering an actor's PromptsRequest (and the frame it came in)."""
        self.acks: Callable[[wire.WeightsIpcAck], None] | None = None
        """transport.weight_sync=ipc: the learner's exporter, taking an actor's acknowledgement of a version."""

    def serve(self) -> int:
        """Take every waiting WeightsRequest; returns how many were answered now (a re-broadcast of the
        newest version started; see WeightPublisher for when it waits)."""
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            identity, body = frames[0], frames[1:]
            try:
                msg = wire.decode_header(body)
                if isinstance(msg, wire.PromptsRequest) and self.dealer is not None:
                    self._deal(identity, msg)
                    continue
                if isinstance(msg, wire.WeightsIpcAck) and self.acks is not None:
                    self.acks(msg)
                    continue
                if not isinstance(msg, wire.WeightsRequest):
                    raise wire.WireError("unexpected_type", f"expected weights_request, got {type(msg).__name__}")
            except wire.WireError as e:
                self.rejected(e)
                continue
            self._request(identity, msg)
        return 0 if self.closing is not None else self.publisher.answer()

    def _request(self, identity: zmq.Frame, msg: wire.WeightsRequest) -> None:
        if self.admit is not None and (refusal := self.admit(msg.actor_id, msg.fingerprint)) is not None:
            if msg.actor_id not in self.refused_actors and len(self.refused_actors) < MAX_PEERS:
                self.refused_actors[msg.actor_id] = refusal
                log.error("refused %s: %s", msg.actor_id, refusal)
            self.rejected.counts["fingerprint_mismatch"] += 1
            self.sock.send_multipart([identity, *wire.encode(wire.Shutdown(reason=wire.REFUSED + refusal))],
                                     copy=False)
            return
        if len(self.peers) < MAX_PEERS:
            self.peers.add(bytes(identity.buffer))
            self.actor_peers[msg.actor_id] = bytes(identity.buffer)
        if self.closing is not None:  # an actor joining while the learner shuts down: tell it to stop
            self.sock.send_multipart([identity, *wire.encode(self.closing)], copy=False)
        else:
            if self.pacing is not None and msg.have_version < 0:  # a joining actor: the pacing it missed
                try:
                    self.sock.send_multipart([identity, *wire.encode(self.pacing)], zmq.NOBLOCK, copy=False)
                except zmq.Again:  # the learner's next Pace reaches it
                    pass
            self.publisher.ask(msg.have_version)

    def _deal(self, identity: zmq.Frame, msg: wire.PromptsRequest) -> None:
        if msg.actor_id in self.refused_actors:
            return
        deal = wire.Deal(done=True) if self.closing is not None else self.dealer(msg, identity)  # its connection
        try:
            self.sock.send_multipart([identity, *wire.encode(deal)], zmq.NOBLOCK, copy=False)
        except zmq.Again:  # the actor asks again when no deal comes
            pass

    def send_to(self, actor_id: str, msg: wire.EvalRequest) -> bool:
        """A notice to one actor (by the id its weight requests gave); False if it never asked or cannot take it."""
        peer = self.actor_peers.get(actor_id)
        if peer is None:
            return False
        try:
            self.sock.send_multipart([peer, *wire.encode(msg)], zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def demand(self, version: int, groups_missing: int, counts: dict[str, int] | None = None) -> None:
        """Ask for `groups_missing` groups at `version`: of the actors `counts` names (None: of every actor)."""
        self._notify(wire.Demand(version=version, groups_missing=groups_missing, counts=counts))

    def pace(self, msg: wire.Pace) -> None:
        """Every actor that asked for weights paces its generation by `msg` (a late one gets the newest on asking)."""
        self.pacing = msg
        self._notify(msg)

    def shutdown(self, reason: str = "done") -> None:
        """Tell every actor the run is over, here and on the weight broadcast (which also reaches an actor that
        never asked); from now on a request is answered with the notice."""
        self.publisher.flush()
        self.closing = wire.Shutdown(reason=reason)
        self._notify(self.closing)
        self.publisher.broadcast(wire.Shutdown(reason=reason))

    def _notify(self, msg) -> None:
        frames = wire.encode(msg)
        for peer in self.peers:  # a peer that has gone away is dropped silently (not ROUTER_MANDATORY)
            try:
                self.sock.send_multipart([peer, *frames], zmq.NOBLOCK)
            except zmq.Again:
                pass

    def close(self, linger_ms: int = 500) -> None:
        """Give queued notices (the shutdown above all) up to `linger_ms` to leave."""
        self.sock.close(linger=linger_ms)


class Inbox:
    """Actor end (DEALER, connects): asks for weights, and keeps the learner's notices until the actor's loop
    takes them: `shutdown` (once it came), the newest `Demand` and `Pace`, and eval requests, oldest first.

    A message that is no notice (weights) goes to `other`, the weight subscriber that watches this socket.
    """

    def __init__(self, ctx: zmq.Context, addr: str, actor_id: str, max_bytes: int, curve: Curve | None = None,
                 fingerprint: dict | None = None):
        self.sock = make(ctx, zmq.DEALER, max_bytes, curve)
        self.sock.connect(addr)
        self.actor_id = actor_id
        self.fingerprint = fingerprint
        """Sent with every request: the learner's handshake (None: admitted without one)."""
        self.rejected = RejectCounter(f"weight subscriber {actor_id}")
        self.other: Callable[[list, wire.Header], None] | None = None
        self.shutdown: wire.Shutdown | None = None
        self.demand: wire.Demand | None = None
        self.pace: wire.Pace | None = None
        self.eval_requests: collections.deque[wire.EvalRequest] = collections.deque(maxlen=1000)
        self.deals: collections.deque[wire.Deal] = collections.deque()  # the dealer's answers (task.epochs)

    def request(self, have_version: int) -> None:
        """Ask for the newest weights; dropped if no learner connection can take it now (it is asked again)."""
        try:
            self.sock.send_multipart(wire.encode(wire.WeightsRequest(
                actor_id=self.actor_id, have_version=have_version, fingerprint=self.fingerprint)), zmq.NOBLOCK)
        except zmq.Again:
            pass

    def receive(self) -> None:
        """Take in every message waiting on the socket."""
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                header = wire.decode_header(frames)
            except wire.WireError as e:
                self.rejected(e)
                continue
            if self.note(header):
                continue
            if self.other is None:
                self.rejected(wire.WireError("unexpected_type", f"expected a notice, got {type(header).__name__}"))
            else:
                self.other(frames, header)

    def note(self, header: wire.Header) -> bool:
        """Keep `header` if it is a notice (from either channel); False if it is not one."""
        if isinstance(header, wire.Shutdown):
            self.shutdown = header
        elif isinstance(header, wire.Demand):
            if self.demand is None or header.version >= self.demand.version:
                self.demand = header
        elif isinstance(header, wire.Pace):
            if self.pace is None or header.version >= self.pace.version:
                self.pace = header
        elif isinstance(header, wire.EvalRequest):
            self.eval_requests.append(header)
        elif isinstance(header, wire.Deal):
            self.deals.append(header)
        else:
            return False
        return True

    def demanded(self, version: int) -> bool:
        return self.demand is not None and self.demand.version == version

    def take_demand(self, version: int) -> wire.Demand | None:
        """The learner's request for more groups made at `version`, once."""
        if not self.demanded(version):
            return None
        d, self.demand = self.demand, None
        return d

    def take_pace(self) -> wire.Pace | None:
        """The learner's newest pacing not yet taken, once."""
        p, self.pace = self.pace, None
        return p

    def ack(self, msg: wire.WeightsIpcAck) -> None:
        """Acknowledge an IPC version (the learner frees its buffer); dropped if no connection can take it now (the
        next acknowledgement covers it: each one covers every older version)."""
        try:
            self.sock.send_multipart(wire.encode(msg), zmq.NOBLOCK)
        except zmq.Again:
            pass

    def ask_prompts(self, msg: wire.PromptsRequest) -> bool:
        """Send a PromptsRequest; False if no learner connection can take it now (ask again later)."""
        try:
            self.sock.send_multipart(wire.encode(msg), zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def take_eval(self) -> wire.EvalRequest | None:
        """The oldest eval request the learner sent this actor, once."""
        self.receive()
        return self.eval_requests.popleft() if self.eval_requests else None

    @property
    def refused(self) -> str | None:
        """Why the learner refused this actor, if it did."""
        if self.shutdown is not None and self.shutdown.reason.startswith(wire.REFUSED):
            return self.shutdown.reason.removeprefix(wire.REFUSED)
        return None

    def close(self) -> None:
        self.sock.close(linger=0)
