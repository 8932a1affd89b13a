"""streamrl.telemetry.exporter: its histogram of weighted arrays against prometheus_client's, and its HTTP endpoints
(/metrics, /healthz) and what happens when its port is taken."""

from __future__ import annotations

import json
import logging
import math
import socket
import urllib.error
import urllib.request

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram

from streamrl.telemetry.exporter import Exporter, Health, WeightedHistogram, serve


# ── WeightedHistogram ───────────────────────────────────────────────────────────────────────────

def test_weighted_histogram_bins_like_prometheus_client_including_values_on_a_bound():
    values = [0.0, 0.25, 0.3, 1.0, 1.0, 2.5, 7.0, -1.0]
    buckets = [0.0, 0.25, 1.0, 2.5]
    reference = CollectorRegistry()
    h = Histogram("ref", "r", buckets=buckets, registry=reference)
    for v in values:
        h.observe(v)
    ours = CollectorRegistry()
    WeightedHistogram(ours, "ref", "r", buckets, {}).observe(np.array(values))
    expect = {(s.name, s.labels.get("le")): s.value for s in next(iter(reference.collect())).samples
              if not s.name.endswith("_created")}
    got = {(s.name, s.labels.get("le")): s.value for s in next(iter(ours.collect())).samples}
    assert got == expect


def test_weighted_histogram_weights_count_and_non_finite_values_are_set_aside():
    registry = CollectorRegistry()
    h = WeightedHistogram(registry, "lag", "l", [0, 1, 2], {"run": "x"})
    h.observe(np.array([0, 2, math.nan, math.inf]), weights=np.array([3, 5, 7, 1]))
    assert registry.get_sample_value("lag_bucket", {"run": "x", "le": "0.0"}) == 3
    assert registry.get_sample_value("lag_count", {"run": "x"}) == 8
    assert registry.get_sample_value("lag_sum", {"run": "x"}) == 10
    assert h.dropped == 2


# ── Exporter ────────────────────────────────────────────────────────────────────────────────────

def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture
def exporter():
    registry = CollectorRegistry()
    WeightedHistogram(registry, "streamrl_demo", "d", [1], {"run": "x"}).observe(np.array([0.5]))
    # A beat counts for a minute: a GET right after one answers 200 even on a loaded machine (0.2 s did not
    # always hold); the stalled case moves the last beat back instead of sleeping past the limit.
    health = Health("learner", healthy_within_s=60.0)
    ex = Exporter(registry, health, "127.0.0.1", 0)
    yield ex
    ex.close()


def test_metrics_and_healthz_are_served_and_any_other_path_is_404(exporter):
    base = f"http://127.0.0.1:{exporter.port}"
    status, body = get(base + "/metrics")
    assert status == 200 and b'streamrl_demo_count{run="x"} 1.0' in body
    assert exporter.scrapes == 1 and exporter.scrape_cpu_s >= 0
    exporter.health.beat(step=7)
    status, body = get(base + "/healthz")
    assert status == 200 and json.loads(body)["step"] == 7
    assert get(base + "/nope")[0] == 404


def test_healthz_answers_503_once_the_main_loop_stops_beating(exporter):
    exporter.health.beat()
    exporter.health._last -= 61.0  # the main loop's last beat, a minute and a second ago
    status, body = get(f"http://127.0.0.1:{exporter.port}/healthz")
    assert status == 503 and json.loads(body)["status"] == "stalled"


def test_port_zero_in_the_config_serves_nothing():
    assert serve(CollectorRegistry(), Health("learner", 1), "127.0.0.1", 0) is None


def test_a_taken_port_is_a_warning_and_the_process_goes_on_without_metrics(caplog):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with caplog.at_level(logging.WARNING, logger="streamrl.telemetry.exporter"):
            assert serve(CollectorRegistry(), Health("actor", 1), "127.0.0.1", port) is None
    assert f"127.0.0.1:{port}" in caplog.text and "monitoring.actor_port" in caplog.text
