"""Socket plumbing every channel shares: addresses, sockets made one way (no linger, the message cap,
CurveZMQ), binding with a clear error, and counting what a receiver rejects.

Receivers never raise on bad input: a rejected message is counted in `rejected[reason]` and
logged once per reason.
"""

from __future__ import annotations

import collections
import logging

import zmq

from streamrl.comm import wire
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


def make(ctx: zmq.Context, kind: int, max_bytes: int | None = None, curve: Curve | None = None) -> zmq.Socket:
    s = ctx.socket(kind)
    s.setsockopt(zmq.LINGER, 0)
    if max_bytes:
        s.setsockopt(zmq.MAXMSGSIZE, max_bytes)
    if curve is not None:
        curve.apply(s)
    return s


def bind(sock: zmq.Socket, addr: str, what: str) -> None:
    try:
        sock.bind(addr)
    except zmq.ZMQError as e:
        raise RuntimeError(
            f"cannot bind the {what} to {addr} ({e}); is another run using it? Choose another port "
            "in the transport section (0 = any free port under `streamrl run`)") from None
