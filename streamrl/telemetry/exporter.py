"""Serve a process's Prometheus registry on /metrics, and /healthz, from a background thread.

The server is bounded (`_ThreadingServer`): at most MAX_WORKERS threads answer requests, and connections that
send nothing hold no thread and are closed after IDLE_S. Each process owns its CollectorRegistry (never
prometheus_client's global one), so several exporters can live in one test process and nothing is registered twice.
"""

from __future__ import annotations

import json
import logging
import selectors
import socket
import socketserver
import threading
import time
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import numpy as np
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

log = logging.getLogger("streamrl.telemetry.exporter")


class Health:
    """Proof of life for /healthz: the main loop calls beat(); a silence longer than the limit is 503.

    Progress, where the process has work that should finish (an actor's generate calls): `busy(what)` when it
    starts and `done()` when it ends; one running past `stall_after_s` is 503 too, however alive the loop is (a
    hung reward or tool call, an engine that stopped answering). Waiting between pieces of work (an actor the
    learner holds back on staleness, or waiting for weights) is not a stall: the clock runs only while busy."""

    def __init__(self, role: str, healthy_within_s: float, stall_after_s: float = 0.0):
        """stall_after_s: longest one piece of work may take before /healthz says stalled (0: no limit)."""
        self.role = role
        self.healthy_within_s, self.stall_after_s = healthy_within_s, stall_after_s
        self.info: dict = {}  # extra fields shown on /healthz (policy version, step, …)
        self._last = time.monotonic()
        self._busy: tuple[str, float] | None = None  # (what, since when)

    def beat(self, **info) -> None:
        self._last = time.monotonic()
        self.info.update(info)

    def busy(self, what: str) -> None:
        """A piece of work that should finish within stall_after_s starts (`what` names it on /healthz)."""
        self._busy = (what, time.monotonic())

    def done(self) -> None:
        """It finished: progress."""
        self._busy = None
        self.beat()

    def status(self) -> tuple[bool, dict]:
        now = time.monotonic()
        age, busy = now - self._last, self._busy
        reason = None
        if busy is not None and self.stall_after_s and now - busy[1] > self.stall_after_s:  # the more telling
            reason = (f"{busy[0]} has made no progress for {now - busy[1]:.0f}s (monitoring.actor_stall_s="
                      f"{self.stall_after_s:g}): no group made or sent meanwhile")
        elif age > self.healthy_within_s:
            reason = f"the main loop has shown no sign of life for {age:.0f}s (monitoring.healthy_within_s)"
        return reason is None, {"status": "ok" if reason is None else "stalled", "role": self.role,
                                "last_progress_s_ago": round(age, 3), "healthy_within_s": self.healthy_within_s,
                                **({"reason": reason} if reason else {}), **self.info}


MAX_WORKERS = 8  # threads answering requests at once
MAX_WAITING = 256  # accepted connections that have sent nothing yet; past this the oldest is closed
IDLE_S = 10.0  # a connection that sends no request in this long is closed
IO_TIMEOUT_S = 5.0  # a request that stalls mid-way (slowloris) loses its worker after this long


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    """Threads only for connections that have sent something, at most MAX_WORKERS at once: a connection that
    sends nothing waits in one selector (no thread) until it does or IDLE_S passes, and no more than MAX_WAITING
    of them wait, so hundreds of idle connections cost file descriptors for seconds, never threads, and
    /metrics still answers."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # a burst of connections waits in the kernel's queue, not in SYN retries

    def __init__(self, *args, **kwargs):
        self.waiting: dict[socket.socket, float] = {}  # accepted connection -> when
        self.selector = selectors.DefaultSelector()
        self.workers = threading.BoundedSemaphore(MAX_WORKERS)
        self.closed_idle = 0
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address):
        """On accept: wait (without a thread) for the request to arrive."""
        if len(self.waiting) >= MAX_WAITING:
            self._drop(next(iter(self.waiting)))
        self.waiting[request] = time.monotonic()
        self.selector.register(request, selectors.EVENT_READ, client_address)

    def service_actions(self) -> None:
        """Between accepts (every poll interval): hand the connections that sent something to a worker, close
        the ones idle too long."""
        for key, _ in self.selector.select(0) if self.waiting else ():
            if not self.workers.acquire(blocking=False):
                break  # every worker busy: the request waits its turn in the selector
            request = key.fileobj
            self.selector.unregister(request)
            del self.waiting[request]
            request.settimeout(IO_TIMEOUT_S)
            super().process_request(request, key.data)
        now = time.monotonic()
        for request in [r for r, t in self.waiting.items() if now - t > IDLE_S]:
            self._drop(request)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.workers.release()

    def handle_error(self, request, client_address):  # a peer that timed out or vanished is no error of ours
        pass

    def _drop(self, request) -> None:
        self.selector.unregister(request)
        del self.waiting[request]
        self.shutdown_request(request)
        self.closed_idle += 1

    def server_close(self) -> None:
        for request in list(self.waiting):
            self._drop(request)
        self.selector.close()
        super().server_close()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # one line per scrape would drown the process log
        pass


class Exporter:
    """HTTP server for /metrics (prometheus-client's WSGI app) and /healthz (JSON, 200 or 503)."""

    def __init__(self, registry: CollectorRegistry, health: Health, host: str, port: int):
        self.health = health
        self.scrapes = 0
        self.scrape_cpu_s = 0.0  # CPU time this process spent rendering /metrics: the cost of being scraped
        metrics_app = make_wsgi_app(registry)

        def app(environ, start_response):
            path = environ.get("PATH_INFO", "/")
            if path == "/healthz":
                ok, body = self.health.status()
                start_response("200 OK" if ok else "503 Service Unavailable",
                               [("Content-Type", "application/json")])
                return [json.dumps(body).encode()]
            if path in ("/metrics", "/"):
                t0 = time.thread_time()
                try:
                    return metrics_app(environ, start_response)
                finally:
                    self.scrape_cpu_s += time.thread_time() - t0
                    self.scrapes += 1
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"streamrl serves /metrics and /healthz\n"]

        self.server = make_server(host, port, app, _ThreadingServer, handler_class=_QuietHandler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), name="metrics", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(registry: CollectorRegistry, health: Health, host: str, port: int) -> Exporter | None:
    """Start serving, or return None when port is 0 or cannot be bound (training goes on; the
    warning says why, and Prometheus's `up` for this target shows it)."""
    if not port:
        return None
    try:
        exporter = Exporter(registry, health, host, port)
    except OSError as e:
        log.warning("metrics: cannot serve /metrics on %s:%d (%s); this process runs without metrics. "
                    "Set monitoring.%s_port to a free port, or 0 to turn this off.", host, port, e.strerror or e,
                    "learner" if health.role == "learner" else "actor")
        return None
    log.info("metrics: http://%s:%d/metrics and /healthz", host, exporter.port)
    return exporter


class WeightedHistogram:
    """A Prometheus histogram filled from whole arrays at once, each value with a weight (a count).

    prometheus_client's Histogram.observe takes one value per call (about a microsecond each), a
    second per step at a million tokens; here a step's values are binned by numpy. Non-finite
    values are not observed (they are counted in `dropped`).
    """

    def __init__(self, registry: CollectorRegistry | None, name: str, documentation: str, buckets,
                 labels: dict[str, str]):
        """registry None: the owner collects it (see LearnerMetrics)."""
        self.name, self.documentation, self.labels = name, documentation, labels
        self.bounds = np.asarray(sorted(set(float(b) for b in buckets)), dtype=np.float64)
        self.counts = np.zeros(len(self.bounds) + 1)  # per bucket, the last one is +Inf
        self.sum = 0.0
        self.dropped = 0
        self._lock = threading.Lock()
        if registry is not None:
            registry.register(self)

    def observe(self, values, weights=None) -> None:
        """values: any shape; weights: same shape (default 1 each)."""
        v = np.asarray(values, dtype=np.float64).ravel()
        w = None if weights is None else np.asarray(weights, dtype=np.float64).ravel()
        finite = np.isfinite(v)
        if not finite.all():
            self.dropped += int((~finite).sum())
            v, w = v[finite], (None if w is None else w[finite])
        per_bucket = np.bincount(self.bounds.searchsorted(v), weights=w, minlength=len(self.counts))
        total = float(v.sum() if w is None else v @ w)
        with self._lock:
            self.counts += per_bucket
            self.sum += total

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=list(self.labels))

    def describe(self):
        return [self._family()]

    def collect(self):
        with self._lock:
            cumulative, total = np.cumsum(self.counts), self.sum
        family = self._family()
        buckets = [(floatToGoString(b), float(c)) for b, c in zip(self.bounds, cumulative[:-1])]
        family.add_metric(list(self.labels.values()), buckets + [("+Inf", float(cumulative[-1]))], sum_value=total)
        return [family]
