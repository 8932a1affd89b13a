"""learner.connections: a session's connection to the control socket closing (its actor exited or was killed) is
known within a second, from a real DEALER in a process of its own that is SIGKILLed."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import zmq

from streamrl.learner.connections import Connections

pytestmark = pytest.mark.timeout(60)

ACTOR = """
import sys, time, zmq
d = zmq.Context().socket(zmq.DEALER)
d.connect(sys.argv[1])
for _ in range(int(sys.argv[3])):
    d.send(sys.argv[2].encode())
time.sleep(120)
"""


def _actor(addr: str, session: str, requests: int = 1) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", ACTOR, addr, session, str(requests)])


def _request(router: zmq.Socket, connections: Connections) -> str:
    assert router.poll(20_000), "no request came"
    identity, body = router.recv_multipart(copy=False)
    connections.saw(identity, body.bytes.decode())
    return body.bytes.decode()


def test_a_killed_actors_session_is_known_gone_within_a_second_and_a_live_ones_is_not():
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    connections = Connections(router)
    actors = [_actor(f"tcp://127.0.0.1:{port}", s) for s in ("dead", "alive")]
    try:
        assert {_request(router, connections), _request(router, connections)} == {"dead", "alive"}
        assert connections.closed() == []
        actors[0].kill()
        actors[0].wait()
        t0 = time.monotonic()
        gone: list[str] = []
        while not gone and time.monotonic() - t0 < 5:
            gone = connections.closed()
            time.sleep(0.01)
        assert gone == ["dead"], gone
        assert time.monotonic() - t0 < 1.0
        assert connections.closed() == [] and connections.count == 1  # told once; the live one stays
    finally:
        for a in actors:
            a.kill()
            a.wait()
        connections.close()
        router.close(linger=0)
        ctx.term()


def test_a_request_queued_before_its_actor_died_is_known_to_have_come_on_a_closed_connection():
    """The learner read the disconnect (and dealt the dead session's prompts again) before a request the actor had
    sent just before dying: that request must not be dealt to (seen: its prompts waited 151 s for the silence)."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    connections = Connections(router)
    dead = _actor(f"tcp://127.0.0.1:{port}", "dead", requests=2)
    try:
        assert _request(router, connections) == "dead"
        assert router.poll(20_000)  # the second request is waiting in the socket
        dead.kill()
        dead.wait()
        t0 = time.monotonic()
        while not connections.closed() and time.monotonic() - t0 < 5:
            time.sleep(0.01)
        identity, body = router.recv_multipart(copy=False)
        assert body.bytes == b"dead" and connections.came_closed(identity)
        later = _actor(f"tcp://127.0.0.1:{port}", "later")  # a new connection, whatever fd it gets, is live
        try:
            assert router.poll(20_000)
            identity, body = router.recv_multipart(copy=False)
            connections.closed()  # its accept is read before its request is judged, as the dealer does
            assert body.bytes == b"later" and not connections.came_closed(identity)
        finally:
            later.kill()
            later.wait()
    finally:
        dead.kill()
        dead.wait()
        connections.close()
        router.close(linger=0)
        ctx.term()
