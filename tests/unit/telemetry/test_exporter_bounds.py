"""The metrics/health server stays bounded under idle connections (issue 41 row 8): connections that send
nothing hold no thread and are closed after a while, and /metrics still answers beside hundreds of them."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest
from prometheus_client import Counter

from streamrl.telemetry import exporter, prometheus_metrics

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def server():
    registry = prometheus_metrics.new_registry()
    Counter("streamrl_probe", "a metric to find", registry=registry).inc()
    ex = exporter.Exporter(registry, exporter.Health("learner", 60.0), "127.0.0.1", 0)
    yield ex
    ex.close()


def test_hundreds_of_idle_connections_take_no_threads_and_metrics_still_answers(server):
    threads_before = threading.active_count()
    idle = []
    try:
        for _ in range(600):  # more than MAX_WAITING: the oldest are closed to make room
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        deadline = time.monotonic() + 10
        while len(server.server.waiting) < exporter.MAX_WAITING and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(server.server.waiting) <= exporter.MAX_WAITING
        assert threading.active_count() <= threads_before + exporter.MAX_WORKERS
        t0 = time.monotonic()
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10).read().decode()
        assert "streamrl_probe_total 1.0" in body and time.monotonic() - t0 < 10
        health = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=10).read()
        assert b'"status": "ok"' in health
        assert threading.active_count() <= threads_before + exporter.MAX_WORKERS
        assert server.server.closed_idle >= 600 - exporter.MAX_WAITING  # the oldest made room
    finally:
        for s in idle:
            s.close()


def test_a_connection_that_sends_nothing_is_closed_after_the_idle_limit(server, monkeypatch):
    monkeypatch.setattr(exporter, "IDLE_S", 0.5)
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    t0 = time.monotonic()
    assert s.recv(1) == b""  # closed by the server, not by this test's timeout
    assert 0.4 < time.monotonic() - t0 < 8
    s.close()


def test_a_request_that_stalls_half_way_loses_its_worker(server, monkeypatch):
    monkeypatch.setattr(exporter, "IO_TIMEOUT_S", 0.5)
    slow = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(exporter.MAX_WORKERS)]
    for s in slow:
        s.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the rest (slowloris)
    t0 = time.monotonic()
    body = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=20).read()
    assert b"streamrl_probe_total" in body and time.monotonic() - t0 < 15
    for s in slow:
        s.close()
