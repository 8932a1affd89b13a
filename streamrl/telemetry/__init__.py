"""Telemetry: the Prometheus metric families, their /metrics and /healthz server, start-up phases."""
