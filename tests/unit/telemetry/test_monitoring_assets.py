"""monitoring/: the committed dashboard is what dashboard.py makes, Prometheus accepts the config
and rules, and every metric they name is one that learner or actors export."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from streamrl.telemetry import actor_metrics, prometheus_metrics

MONITORING = Path(__file__).resolve().parents[3] / "monitoring"
sys.path.insert(0, str(MONITORING))
import dashboard  # noqa: E402

RULES = yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"][0]["rules"]


def exported_names() -> set[str]:
    registry = prometheus_metrics.new_registry()
    prometheus_metrics.LearnerMetrics(registry, "r", "corpo", [0, 1], 2)
    actor_metrics.ActorMetrics(registry, "r", "actor-0")
    text = generate_latest(registry).decode()
    return set(re.findall(r"^# TYPE (\w+) ", text, re.M))


def named_metrics(expr: str) -> set[str]:
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in re.findall(r"\b(streamrl_\w+)", expr)}


def test_the_committed_dashboard_json_is_what_dashboard_py_makes():
    assert (MONITORING / "grafana" / "dashboards" / "streamrl.json").read_text() == dashboard.render(), \
        "run: python monitoring/dashboard.py"


def test_every_metric_the_dashboard_and_the_alerts_query_is_exported():
    exported = exported_names()
    used = set().union(*(named_metrics(q) for _, q in dashboard.queries(dashboard.build())),
                       *(named_metrics(r["expr"]) for r in RULES))
    assert used and used <= exported, f"not exported: {sorted(used - exported)}"


def test_the_dashboard_shows_the_learning_signal_and_a_row_per_actor():
    d = dashboard.build()
    exprs = " ".join(q for _, q in dashboard.queries(d))
    for name in ("streamrl_advantage_pos_neg_count_ratio", "streamrl_advantage_pos_neg_loss_ratio",
                 "streamrl_failed_positive_fraction", "streamrl_corpo_phase_fraction",
                 "streamrl_sample_staleness_versions_bucket", "streamrl_learner_phase_seconds_total"):
        assert name in exprs
    assert [p.get("repeat") for p in d["panels"] if p["type"] == "row"].count("actor") == 1
    assert len({p["id"] for p in d["panels"]}) == len(d["panels"])


def test_every_alert_says_how_bad_and_what_happened():
    names = [r["alert"] for r in RULES]
    assert len(set(names)) == len(names)
    for r in RULES:
        assert r["labels"]["severity"] in ("warning", "critical"), r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]


def test_the_alerts_cover_the_failures_users_page_on():
    names = {r["alert"] for r in RULES}
    assert {"StreamrlLearnerStalled", "StreamrlStalenessNearBound", "StreamrlAdvantageSignCollapse",
            "StreamrlFailedSampleReinforced", "StreamrlActorDown", "StreamrlWeightPublishSlow"} <= names


@pytest.mark.parametrize("what, path", [("config", "prometheus.yml"), ("rules", "alerts.yml")])
def test_promtool_accepts_the_shipped_file(what, path, promtool_bin):
    check = subprocess.run([promtool_bin, "check", what, str(MONITORING / path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_compose_file_mounts_files_that_exist():
    compose = yaml.safe_load((MONITORING / "compose.yml").read_text())
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (MONITORING / source).exists(), source
    provisioned = yaml.safe_load((MONITORING / "grafana/provisioning/dashboards/streamrl.yml").read_text())
    assert provisioned["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    assert json.loads((MONITORING / "grafana/dashboards/streamrl.json").read_text())["uid"] == "streamrl"


def test_the_ess_collapse_alert_fires_on_a_collapsed_effective_sample_size_and_not_on_a_healthy_one(
        promtool_bin, tmp_path):
    # One scrape a minute for 30 minutes: run "bad" sits at an ESS of 0.1, run "ok" at 0.9 (promtool test rules).
    tests = {
        "rule_files": [str(MONITORING / "alerts.yml")],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": 'streamrl_importance_ess_fraction{run="bad", estimator="corpo"}', "values": "0.1x30"},
                {"series": 'streamrl_importance_ess_fraction{run="ok", estimator="corpo"}', "values": "0.9x30"}],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "StreamrlImportanceESSCollapse", "exp_alerts": []},
                {"eval_time": "25m", "alertname": "StreamrlImportanceESSCollapse", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "run": "bad", "estimator": "corpo"},
                    "exp_annotations": {
                        "summary": "run bad: the importance weights' effective sample size is 10% of the tokens",
                        "description": next(r for r in RULES if r["alert"] == "StreamrlImportanceESSCollapse")
                        ["annotations"]["description"]}}]}]}]}
    path = tmp_path / "ess_test.yml"
    path.write_text(yaml.safe_dump(tests))
    check = subprocess.run([promtool_bin, "test", "rules", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
