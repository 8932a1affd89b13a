"""The streamrl Grafana dashboard, as code: `python monitoring/dashboard.py` rewrites
monitoring/grafana/dashboards/streamrl.json (a test fails when the committed JSON is not current).

Plain dicts in Grafana's dashboard JSON model (schemaVersion 39), so nothing beyond the standard
library is needed to change a panel. Every query filters on the `$run` variable; the actor row
repeats once per value of `$actor`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "grafana" / "dashboards" / "streamrl.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
L = '{run=~"$run"}'  # the label filter every learner query carries
A = '{run=~"$run", actor=~"$actor"}'
RI = "$__rate_interval"


POS = '{run=~"$run", sign="positive"}'
NEG = '{run=~"$run", sign="negative"}'
AFTER_FILTER = '{run=~"$run", stage="after_filter"}'
BEFORE_FILTER = '{run=~"$run", stage="before_filter"}'


class Layout:
    """Places panels left to right in rows of 24 grid units."""

    def __init__(self):
        self.panels: list[dict] = []
        self.x = self.y = 0
        self.next_id = 1

    def add(self, panel: dict, w: int = 8, h: int = 8) -> None:
        if self.x + w > 24:
            self.x, self.y = 0, self.y + h
        panel.update(id=self.next_id, gridPos={"x": self.x, "y": self.y, "w": w, "h": h}, datasource=DS)
        self.next_id += 1
        self.x += w
        self.panels.append(panel)

    def row(self, title: str, repeat: str | None = None) -> None:
        if self.x:
            self.x, self.y = 0, self.y + 8
        row = {"type": "row", "title": title, "collapsed": False, "id": self.next_id,
               "gridPos": {"x": 0, "y": self.y, "w": 24, "h": 1}, "panels": []}
        if repeat:
            row["repeat"] = repeat
        self.next_id += 1
        self.y += 1
        self.panels.append(row)


def target(expr: str, legend: str, ref: str, fmt: str = "time_series") -> dict:
    return {"expr": expr, "legendFormat": legend, "refId": ref, "format": fmt, "datasource": DS}


def timeseries(title: str, description: str, targets: list[tuple[str, str]], unit: str = "short",
               stack: bool = False, log: bool = False, overrides: list | None = None) -> dict:
    custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 30 if stack else 0, "showPoints": "never",
              "stacking": {"mode": "normal" if stack else "none", "group": "A"}, "spanNulls": True}
    if log:
        custom["scaleDistribution"] = {"type": "log", "log": 10}
    return {"type": "timeseries", "title": title, "description": description,
            "targets": [target(e, lg, chr(65 + i)) for i, (e, lg) in enumerate(targets)],
            "fieldConfig": {"defaults": {"unit": unit, "custom": custom}, "overrides": overrides or []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}}}


def heatmap(title: str, description: str, expr: str, unit: str = "short") -> dict:
    return {"type": "heatmap", "title": title, "description": description,
            "targets": [target(expr, "{{le}}", "A", fmt="heatmap")],
            "options": {"calculate": False, "yAxis": {"unit": unit}, "cellGap": 1,
                        "color": {"mode": "scheme", "scheme": "Blues", "steps": 64}},
            "fieldConfig": {"defaults": {}, "overrides": []}}


def stat(title: str, description: str, expr: str, unit: str = "short", legend: str = "") -> dict:
    return {"type": "stat", "title": title, "description": description, "targets": [target(expr, legend, "A")],
            "options": {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value", "graphMode": "area"},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}}


def build() -> dict:
    p = Layout()
    # ── Learning signal ────────────────────────────────────────────────────────────────────────
    p.row("Learning signal")
    p.add(timeseries(
        "r_count and r_loss (paper Fig. 2)",
        "Positive/negative advantage ratios per step: r_count = #{A>0}/#{A<0}, r_loss = |loss of A>0| / "
        "|loss of A<0|. The window line is r_count over the rate interval. Grafana plots over time, "
        "the paper over steps.",
        [(f"streamrl_advantage_pos_neg_count_ratio{L}", "r_count {{run}}"),
         (f"streamrl_advantage_pos_neg_loss_ratio{L}", "r_loss {{run}}"),
         (f"sum by (run) (rate(streamrl_advantages_total{POS}[{RI}])) / "
          f"sum by (run) (rate(streamrl_advantages_total{NEG}[{RI}]))",
          "r_count window {{run}}")],
        log=True), w=12)
    p.add(timeseries(
        "Failed-positive and CoRPO phase fractions",
        "failed+: share of samples with R < R_min_correct and A > 0 (always 0 under corpo and static). "
        "phase: share of groups whose CoRPO baseline is clamped to R_min_correct.",
        [(f"streamrl_failed_positive_fraction{L}", "failed+ {{run}} ({{estimator}})"),
         (f"streamrl_corpo_phase_fraction{L}", "CoRPO phase {{run}}")], unit="percentunit"), w=12)
    p.add(timeseries(
        "Sample census, before and after dynamic filtering (paper Fig. 1)",
        "Share of the last batch's samples in {failed, passed} x {A > 0, A <= 0}: after the actors' dynamic "
        "filtering (the trained samples, solid) and before it (with the samples of the groups filtered out). "
        "failed A > 0 is 0 under corpo and static; filtering removes all-equal groups, mostly failed ones.",
        [(f"streamrl_sample_census_fraction{AFTER_FILTER}", "{{cell}} after"),
         (f"streamrl_sample_census_fraction{BEFORE_FILTER}", "{{cell}} before")],
        unit="percentunit"), w=24)
    p.add(heatmap("Reward distribution", "Rewards of trained samples per interval (bucket = reward level).",
                  f"sum by (le) (increase(streamrl_reward_bucket{L}[{RI}]))"))
    p.add(timeseries(
        "Reward and success rate", "Mean reward of each batch and share of samples at or above R_min_correct.",
        [(f"streamrl_reward_mean{L}", "reward {{run}}"), (f"streamrl_success_rate{L}", "success {{run}}"),
         (f"sum by (run) (rate(streamrl_reward_sum{L}[{RI}])) / sum by (run) (rate(streamrl_reward_count{L}[{RI}]))",
          "reward window {{run}}")]))
    p.add(timeseries(
        "Advantage signs", "Trained samples per second by advantage sign.",
        [(f"sum by (sign) (rate(streamrl_advantages_total{L}[{RI}]))", "{{sign}}")], unit="ops", stack=True))
    # ── Optimisation ───────────────────────────────────────────────────────────────────────────
    p.row("Optimisation")
    p.add(timeseries("Loss", "Policy loss of the last step.", [(f"streamrl_loss{L}", "{{run}}")]))
    p.add(timeseries("Gradient norm and learning rate", "Before clipping.",
                     [(f"streamrl_grad_norm{L}", "grad norm {{run}}"),
                      (f"streamrl_learning_rate{L}", "lr {{run}}")]))
    p.add(timeseries(
        "Importance ratio", "Quantiles of pi_learner/pi_behaviour over trained tokens, and the clipped share.",
        [(f"histogram_quantile({q}, sum by (le) (rate(streamrl_importance_ratio_bucket{L}[{RI}])))", f"p{int(q * 100)}")
         for q in (0.01, 0.5, 0.99)] + [(f"streamrl_clipped_token_fraction{L}", "clipped")]))
    # ── Off-policy correction ──────────────────────────────────────────────────────────────────
    p.row("Off-policy correction")
    p.add(timeseries(
        "Corrected tokens", "Share of the last batch's tokens the objective clipped (trust region), truncated "
        "(importance weight capped) or masked (no gradient): loss.name decides which can happen.",
        [(f"streamrl_clipped_token_fraction{L}", "clipped {{run}}"),
         (f"streamrl_truncated_token_fraction{L}", "truncated {{run}}"),
         (f"streamrl_masked_token_fraction{L}", "masked {{run}}")], unit="percentunit"))
    p.add(timeseries(
        "Importance weights' effective sample size", "(sum w)^2 / (N sum w^2) over the last batch's N tokens: 1 when "
        "every token weighs the same, small when a few tokens carry the update (StreamrlImportanceESSCollapse); "
        "the step scale is the lr multiplier loss.variance_control=ess_step takes from it (1 otherwise).",
        [(f"streamrl_importance_ess_fraction{L}", "ESS {{run}}"), (f"streamrl_step_scale{L}", "step scale {{run}}")],
        unit="percentunit"))
    p.add(timeseries(
        "Behaviour-learner KL", "KL(behaviour || learner) over the last batch's tokens: how far the policy that "
        "sampled the batch is from the one training on it (staleness, engine mismatch).",
        [(f"streamrl_behaviour_learner_kl{L}", "KL {{run}}")]))
    # ── Pipeline health ────────────────────────────────────────────────────────────────────────
    p.row("Pipeline health")
    p.add(heatmap("Staleness of consumed samples", "Lag (learner version - generating version) per interval.",
                  f"sum by (le) (increase(streamrl_sample_staleness_versions_bucket{L}[{RI}]))"))
    p.add(timeseries(
        "Mean staleness vs bound", "Mean lag by sample and by token, the configured max_staleness, and (in-flight "
        "updates) the share of samples whose tokens came from more than one version.",
        [(f"sum by (run) (rate(streamrl_sample_staleness_versions_sum{L}[{RI}])) / "
          f"sum by (run) (rate(streamrl_sample_staleness_versions_count{L}[{RI}]))", "by sample"),
         (f"sum by (run) (rate(streamrl_token_staleness_versions_sum{L}[{RI}])) / "
          f"sum by (run) (rate(streamrl_token_staleness_versions_count{L}[{RI}]))", "by token"),
         (f"streamrl_max_staleness_versions{L}", "bound"),
         (f"streamrl_inflight_sample_fraction{L}", "in-flight share")]))
    p.add(timeseries(
        "Throughput", "Samples and tokens trained per second; tokens generated by all actors.",
        [(f"sum by (run) (rate(streamrl_trained_samples_total{L}[{RI}]))", "samples trained/s"),
         (f"sum by (run) (rate(streamrl_trained_tokens_total{L}[{RI}]))", "tokens trained/s"),
         (f"sum by (run) (rate(streamrl_actor_tokens_generated_total{L}[{RI}]))", "tokens generated/s")],
        unit="ops"))
    p.add(timeseries(
        "Learner step time by phase", "Share of learner wall time in each phase (stacked to 1).",
        [(f"sum by (phase) (rate(streamrl_learner_phase_seconds_total{L}[{RI}]))", "{{phase}}")],
        unit="percentunit", stack=True))
    p.add(timeseries(
        "Weight sync", "Time to gather and broadcast one version (learner) and to load it (actors), p90.",
        [(f"histogram_quantile(0.9, sum by (le) (rate(streamrl_weight_publish_seconds_bucket{L}[{RI}])))",
          "publish p90"),
         (f"histogram_quantile(0.9, sum by (le) (rate(streamrl_actor_weight_apply_seconds_bucket{L}[{RI}])))",
          "apply p90 (actors)")],
        unit="s"))
    p.add(timeseries(
        "Groups: received, used, dropped, rejected", "Per second; dropped and rejected by reason.",
        [(f"sum by (run) (rate(streamrl_groups_received_total{L}[{RI}]))", "received"),
         (f"sum by (run) (rate(streamrl_groups_used_total{L}[{RI}]))", "used"),
         (f"sum by (reason) (rate(streamrl_groups_dropped_total{L}[{RI}]))", "dropped {{reason}}"),
         (f"sum by (reason) (rate(streamrl_messages_rejected_total{L}[{RI}]))", "rejected {{reason}}")],
        unit="ops"))
    p.add(stat("Policy version", "Learner policy version.", f"max by (run) (streamrl_policy_version{L})",
               legend="{{run}}"), w=6, h=4)
    p.add(stat("Actors up", "Actor processes Prometheus can scrape.", 'sum(up{job="streamrl-actors"})',
               legend="actors up"), w=6, h=4)
    p.add(stat("Weights published", "Bytes per second of weights sent (one copy): whole versions (full) and "
               "differences from the previous one (delta, transport.weights_delta) apart.",
               f"sum by (run, kind) (rate(streamrl_weight_publish_bytes_total{L}[{RI}]))", unit="Bps",
               legend="{{run}} {{kind}}"),
          w=6, h=4)
    p.add(stat("Groups dropped", "Valid groups not trained on since the learner started, all reasons.",
               f"sum by (run) (streamrl_groups_dropped_total{L})", legend="{{run}}"), w=6, h=4)
    # ── Actors (one row per actor) ─────────────────────────────────────────────────────────────
    p.row("Actor $actor", repeat="actor")
    p.add(timeseries(
        "Generation throughput", "Completion tokens per second generated by this actor.",
        [(f"rate(streamrl_actor_tokens_generated_total{A}[{RI}])", "{{actor}}"),
         (f"streamrl_actor_generation_tokens_per_second{A}", "last call {{actor}}")], unit="ops"), w=6)
    p.add(timeseries(
        "Time blocked and waiting", "Share of wall time blocked on a full send queue and waiting for weights.",
        [(f"rate(streamrl_actor_send_blocked_seconds_total{A}[{RI}])", "{{actor}} send blocked"),
         (f"rate(streamrl_actor_weights_wait_seconds_total{A}[{RI}])", "{{actor}} waiting for weights"),
         (f"rate(streamrl_actor_generate_seconds_total{A}[{RI}])", "{{actor}} generating")], unit="percentunit"),
          w=6)
    p.add(timeseries(
        "Policy version: learner vs actor",
        "The learner's version and the one this actor generates with. Learner and actors are scraped at "
        "different moments, so with steps much shorter than the scrape interval the gap is noise.",
        [(f"max by (run) (streamrl_policy_version{L})", "learner"),
         (f"streamrl_actor_policy_version{A}", "{{actor}}")]), w=6)
    p.add(timeseries(
        "Groups sent", "Scored groups per second handed to the learner.",
        [(f"rate(streamrl_actor_groups_sent_total{A}[{RI}])", "{{actor}}")], unit="ops"), w=6)

    # ── Multi-turn episodes (task.environment; all actors) ───────────────────────────────────────
    p.row("Multi-turn episodes")
    p.add(timeseries(
        "Turns per episode", "Model turns per episode: mean, and the p90 over the interval.",
        [(f"sum by (run) (rate(streamrl_actor_episode_turns_sum{L}[{RI}])) / "
          f"sum by (run) (rate(streamrl_actor_episode_turns_count{L}[{RI}]))", "mean"),
         (f"histogram_quantile(0.9, sum by (le) (rate(streamrl_actor_episode_turns_bucket{L}[{RI}])))", "p90")]),
        w=6)
    p.add(timeseries(
        "Tool calls", "Tool calls per second by tool and outcome (ok, raised, timeout, unknown_tool, bad_call).",
        [(f"sum by (tool, outcome) (rate(streamrl_actor_tool_calls_total{L}[{RI}]))", "{{tool}} {{outcome}}")],
        unit="ops"), w=6)
    p.add(timeseries(
        "Time in tools", "Tool seconds over episode seconds (both summed over episodes; tools overlap generation).",
        [(f"sum by (run) (rate(streamrl_actor_tool_seconds_total{L}[{RI}])) / "
          f"sum by (run) (rate(streamrl_actor_episode_seconds_total{L}[{RI}]))", "share in tools")],
        unit="percentunit"), w=6)
    p.add(timeseries(
        "Truncated episodes and template drift",
        "Episodes cut short per second by reason (max_turns, max_seq_len), and turns whose chat-template rendering "
        "disagreed with the tokens held.",
        [(f"sum by (reason) (rate(streamrl_actor_episodes_truncated_total{L}[{RI}]))", "truncated: {{reason}}"),
         (f"sum by (run) (rate(streamrl_actor_episodes_template_drift_total{L}[{RI}]))", "template drift")],
        unit="ops"), w=6)
    return {
        "uid": "streamrl", "title": "streamrl", "tags": ["streamrl", "rl"], "timezone": "browser",
        "schemaVersion": 39, "version": 1, "editable": True, "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source"},
            {"name": "run", "type": "query", "datasource": DS, "label": "Run", "multi": True, "includeAll": True,
             "refresh": 2, "query": {"query": "label_values(streamrl_learner_steps_total, run)", "refId": "run"},
             "definition": "label_values(streamrl_learner_steps_total, run)"},
            {"name": "actor", "type": "query", "datasource": DS, "label": "Actor", "multi": True, "includeAll": True,
             "refresh": 2, "query": {"query": 'label_values(streamrl_actor_groups_generated_total{run=~"$run"}, actor)',
                                     "refId": "actor"},
             "definition": 'label_values(streamrl_actor_groups_generated_total{run=~"$run"}, actor)'},
        ]},
        "panels": p.panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query in the dashboard, rows and variables included."""
    out = []
    for panel in dashboard["panels"]:
        for t in panel.get("targets", []):
            out.append((panel["title"], t["expr"]))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            out.append((f"variable {var['name']}", var["query"]["query"]))
    return out


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render())
    print(f"wrote {OUT} ({len(build()['panels'])} panels)", file=sys.stderr)
