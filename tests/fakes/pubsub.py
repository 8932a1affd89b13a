"""PUB/SUB joins late: a PUB drops what it sends until a subscriber's subscription has reached it, which can take
any time on a loaded machine. joined() makes the join happen before a test goes on, instead of sleeping on it."""

from __future__ import annotations

import time

import zmq

PROBE = b"pubsub.joined probe "


def bound(sock: zmq.Socket) -> str:
    """The address `sock` is bound to (the port the OS picked for a `tcp://host:*` bind)."""
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def joined(pub: zmq.Socket, *subs: zmq.Socket, timeout_s: float = 60.0) -> None:
    """Return once each of `subs` (SUB sockets subscribed to everything, connected to `pub`) receives what `pub`
    sends, with every probe this took read back out of them: the test's own messages are the next they see."""
    deadline = time.monotonic() + timeout_s
    seen = [0] * len(subs)  # the newest probe each has received
    sent = 0
    while sent == 0 or min(seen) < sent:
        assert time.monotonic() < deadline, f"subscriptions never reached the publisher: probes seen {seen}/{sent}"
        if min(seen) == 0:  # until every one has joined, each round sends a new probe
            sent += 1
            pub.send(PROBE + str(sent).encode())
        for i, sub in enumerate(subs):
            while sub.poll(10):  # read as they come, so no queue fills and drops the last probe
                frame = sub.recv()
                assert frame.startswith(PROBE), frame[:64]
                seen[i] = int(frame[len(PROBE):])
