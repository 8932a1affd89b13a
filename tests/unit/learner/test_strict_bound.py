"""on_policy strict resolves the staleness bound once: the run-info label and the bound gauge agree on 0."""

from __future__ import annotations

from streamrl.config import load
from streamrl.learner import session
from streamrl.telemetry import prometheus_metrics


def test_a_strict_runs_label_and_gauge_both_show_a_bound_of_zero(monkeypatch):
    made = []
    new_registry = prometheus_metrics.new_registry
    monkeypatch.setattr(prometheus_metrics, "new_registry", lambda: made.append(new_registry()) or made[-1])
    cfg = load(None, ["on_policy=strict", "max_staleness=2", "monitoring.learner_port=0"])
    session._monitoring(cfg, [0.0, 1.0])
    labels = {"run": cfg.name, "estimator": cfg.advantage.estimator}
    info = {s.labels["max_staleness"] for m in made[0].collect() for s in m.samples if s.name == "streamrl_run_info"}
    assert info == {"0"}
    assert made[0].get_sample_value("streamrl_max_staleness_versions", labels) == 0.0
