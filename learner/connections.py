"""Which actor sessions asked through which connection of the control socket, and which connections have closed.

An actor that exits, crashes or is killed (SIGKILL included: the kernel closes its sockets) closes its TCP
connection to the learner's control ROUTER at once, and a ZeroMQ socket monitor reports the disconnect within
milliseconds. Each request names its session and arrives on a connection (the frame's source fd), so the session
is known gone long before a silence would say so (learner.dealing: half of learner.data_timeout_s, which must allow
for the slowest generate call). A silence remains the only word for a host that vanishes without closing anything.

A closed connection's fd may be taken by the next one: events are read before the requests that follow them, and
a session wrongly taken for gone (a new connection reusing the fd between two reads) only has its prompts dealt
again: its late groups are then refused as `not_dealt`, never trained twice.
"""

from __future__ import annotations

import logging

import zmq
from zmq.utils.monitor import recv_monitor_message

log = logging.getLogger("streamrl.learner")

MAX_SESSIONS = 10_000  # memory stays bounded whatever peers claim to be


class Connections:
    def __init__(self, sock: zmq.Socket):
        """sock: the control ROUTER (bound); watched until `close`."""
        self.sock = sock
        self.monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.sessions: dict[int, set[str]] = {}  # connection fd -> the sessions that asked through it
        self.count = 0

    def saw(self, frame: zmq.Frame | None, session: str) -> None:
        """A request of `session` arrived in `frame` (any frame of the message: they share its connection)."""
        if frame is None or self.count >= MAX_SESSIONS:
            return
        try:
            fd = frame.get(zmq.SRCFD)
        except zmq.ZMQError:  # a libzmq without the (deprecated) source fd: silence alone tells
            return
        held = self.sessions.setdefault(fd, set())
        self.count += session not in held
        held.add(session)

    def closed(self) -> list[str]:
        """The sessions whose connection has closed since the last call."""
        gone: list[str] = []
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return gone
            if event["event"] == zmq.EVENT_DISCONNECTED and (held := self.sessions.pop(event["value"], None)):
                self.count -= len(held)
                gone.extend(held)

    def close(self) -> None:
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self.monitor.close(linger=0)
