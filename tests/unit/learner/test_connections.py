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
d.send(sys.argv[2].encode())
time.sleep(120)
"""


def _actor(addr: str, session: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", ACTOR, addr, session])


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
