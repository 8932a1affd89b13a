"""Which actor sessions asked through which connection of the control socket, and which connections have closed.

An actor that exits, crashes or is killed (SIGKILL included: the kernel closes its sockets) closes its TCP
connection to the learner's control ROUTER at once, and a ZeroMQ socket monitor reports the disconnect within
milliseconds. Each request names its session and arrives on a connection (the frame's source fd), so the session
is known gone long before a silence would say so (learner.dealing: half of learner.data_timeout_s, which must allow
for the slowest generate call). A silence remains the only word for a host that vanishes without closing anything.

A request its actor sent just before it died can still be waiting in the socket after the disconnect was read:
it came on a connection now closed (`came_closed`: its fd was disconnected and not accepted again since), so
nothing is dealt to it; dealt, those prompts would wait for the silence to be dealt again (seen: 151 s).

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
        self.monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_ACCEPTED)
        self.sessions: dict[int, set[str]] = {}  # connection fd -> the sessions that asked through it
        self.count = 0
        self.closed_fds: set[int] = set()  # disconnected, and not accepted again since (bounded by the fd limit)

    def came_closed(self, frame: zmq.Frame | None) -> bool:
        """Whether `frame` came on a connection that has closed since (read `closed` first)."""
        if frame is None:
            return False
        try:
            return frame.get(zmq.SRCFD) in self.closed_fds
        except zmq.ZMQError:
            return False

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
            fd = event["value"]
            if event["event"] == zmq.EVENT_ACCEPTED:
                self.closed_fds.discard(fd)
                continue
            self.closed_fds.add(fd)
            if held := self.sessions.pop(fd, None):
                self.count -= len(held)
                gone.extend(held)

    def close(self) -> None:
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self.monitor.close(linger=0)
