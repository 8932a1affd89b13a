"""The streamrl Grafana dashboard, as code: `python monitoring/dashboard.py` rewrites
monitoring/grafana/dashboards/streamrl.json (a test fails when the committed JSON is not current).

The panels are a table (`ROWS`: rows of `Panel`s, each its kind, title, description and (PromQL, legend) queries),
turned into plain dicts in Grafana's dashboard JSON model (schemaVersion 39): a panel is changed or added by
editing its line of the table, with nothing beyond the standard library. Every query filters on the `$run`
variable; the actor row repeats once per value of `$actor`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NamedTuple

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


class Panel(NamedTuple):
    """One panel of the table: what it shows (its queries as (PromQL, legend) pairs) and where (w, h grid units)."""

    kind: str  # "timeseries", "heatmap" (one query, its buckets) or "stat" (one query)
    title: str
    description: str
    targets: list[tuple[str, str]]
    unit: str = "short"
    w: int = 8
    h: int = 8
    stack: bool = False  # timeseries: stacked, filled
    log: bool = False  # timeseries: a log y axis


class Row(NamedTuple):
    title: str
    panels: list[Panel]
    repeat: str | None = None  # a variable: the row repeats once per value of it


def _mean(metric: str, labels: str = L) -> str:
    """The mean of a histogram or summary over the rate interval, per run."""
    return (f"sum by (run) (rate({metric}_sum{labels}[{RI}])) / "
            f"sum by (run) (rate({metric}_count{labels}[{RI}]))")


def _quantile(q: float, metric: str, labels: str = L) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{labels}[{RI}])))"


def _rate(metric: str, by: str = "run", labels: str = L) -> str:
    return f"sum by ({by}) (rate({metric}{labels}[{RI}]))"


ROWS = [
    Row("Learning signal", [
        Panel("timeseries", "r_count and r_loss (paper Fig. 2)",
              "Positive/negative advantage ratios per step: r_count = #{A>0}/#{A<0}, r_loss = |loss of A>0| / "
              "|loss of A<0|. The window line is r_count over the rate interval. Grafana plots over time, "
              "the paper over steps.",
              [(f"streamrl_advantage_pos_neg_count_ratio{L}", "r_count {{run}}"),
               (f"streamrl_advantage_pos_neg_loss_ratio{L}", "r_loss {{run}}"),
               (f"{_rate('streamrl_advantages_total', labels=POS)} / {_rate('streamrl_advantages_total', labels=NEG)}",
                "r_count window {{run}}")], w=12, log=True),
        Panel("timeseries", "Failed-positive and CoRPO phase fractions",
              "failed+: share of samples with R < R_min_correct and A > 0 (always 0 under corpo and static). "
              "phase: share of groups whose CoRPO baseline is clamped to R_min_correct.",
              [(f"streamrl_failed_positive_fraction{L}", "failed+ {{run}} ({{estimator}})"),
               (f"streamrl_corpo_phase_fraction{L}", "CoRPO phase {{run}}")], "percentunit", w=12),
        Panel("timeseries", "Sample census, before and after dynamic filtering (paper Fig. 1)",
              "Share of the last batch's samples in {failed, passed} x {A > 0, A <= 0}: after the actors' dynamic "
              "filtering (the trained samples, solid) and before it (with the samples of the groups filtered out). "
              "failed A > 0 is 0 under corpo and static; filtering removes all-equal groups, mostly failed ones.",
              [(f"streamrl_sample_census_fraction{AFTER_FILTER}", "{{cell}} after"),
               (f"streamrl_sample_census_fraction{BEFORE_FILTER}", "{{cell}} before")], "percentunit", w=24),
        Panel("heatmap", "Reward distribution", "Rewards of trained samples per interval (bucket = reward level).",
              [(f"sum by (le) (increase(streamrl_reward_bucket{L}[{RI}]))", "{{le}}")]),
        Panel("timeseries", "Reward and success rate",
              "Mean reward of each batch and share of samples at or above R_min_correct.",
              [(f"streamrl_reward_mean{L}", "reward {{run}}"), (f"streamrl_success_rate{L}", "success {{run}}"),
               (_mean("streamrl_reward"), "reward window {{run}}")]),
        Panel("timeseries", "Advantage signs", "Trained samples per second by advantage sign.",
              [(_rate("streamrl_advantages_total", "sign"), "{{sign}}")], "ops", stack=True),
    ]),
    Row("Optimisation", [
        Panel("timeseries", "Loss", "Policy loss of the last step.", [(f"streamrl_loss{L}", "{{run}}")]),
        Panel("timeseries", "Gradient norm and learning rate", "Before clipping.",
              [(f"streamrl_grad_norm{L}", "grad norm {{run}}"), (f"streamrl_learning_rate{L}", "lr {{run}}")]),
        Panel("timeseries", "Importance ratio",
              "Quantiles of pi_learner/pi_behaviour over trained tokens, and the clipped share.",
              [(_quantile(q, "streamrl_importance_ratio"), f"p{int(q * 100)}") for q in (0.01, 0.5, 0.99)]
              + [(f"streamrl_clipped_token_fraction{L}", "clipped")]),
    ]),
    Row("Off-policy correction", [
        Panel("timeseries", "Corrected tokens",
              "Share of the last batch's tokens the objective clipped (trust region), truncated "
              "(importance weight capped) or masked (no gradient): loss.name decides which can happen.",
              [(f"streamrl_clipped_token_fraction{L}", "clipped {{run}}"),
               (f"streamrl_truncated_token_fraction{L}", "truncated {{run}}"),
               (f"streamrl_masked_token_fraction{L}", "masked {{run}}")], "percentunit"),
        Panel("timeseries", "Importance weights' effective sample size",
              "(sum w)^2 / (N sum w^2) over the last batch's N tokens: 1 when "
              "every token weighs the same, small when a few tokens carry the update (StreamrlImportanceESSCollapse); "
              "the step scale is the lr multiplier loss.variance_control=ess_step takes from it, times "
              "optim.target_drift's (1 otherwise).",
              [(f"streamrl_importance_ess_fraction{L}", "ESS {{run}}"),
               (f"streamrl_step_scale{L}", "step scale {{run}}")], "percentunit"),
        Panel("timeseries", "Behaviour-learner KL",
              "KL(behaviour || learner) over the last batch's tokens: how far the policy that "
              "sampled the batch is from the one training on it (staleness, engine mismatch); per version: "
              "that KL over the stale groups' lags, what optim.target_drift holds the step size to.",
              [(f"streamrl_behaviour_learner_kl{L}", "KL {{run}}"),
               (f"streamrl_drift_per_version{L}", "per version {{run}}")]),
    ]),
    Row("Pipeline health", [
        Panel("heatmap", "Staleness of consumed samples", "Lag (learner version - generating version) per interval.",
              [(f"sum by (le) (increase(streamrl_sample_staleness_versions_bucket{L}[{RI}]))", "{{le}}")]),
        Panel("timeseries", "Mean staleness vs bound",
              "Mean lag by sample and by token, the configured max_staleness, and (in-flight "
              "updates) the share of samples whose tokens came from more than one version.",
              [(_mean("streamrl_sample_staleness_versions"), "by sample"),
               (_mean("streamrl_token_staleness_versions"), "by token"),
               (f"streamrl_max_staleness_versions{L}", "bound"),
               (f"streamrl_inflight_sample_fraction{L}", "in-flight share")]),
        Panel("timeseries", "Throughput", "Samples and tokens trained per second; tokens generated by all actors.",
              [(_rate("streamrl_trained_samples_total"), "samples trained/s"),
               (_rate("streamrl_trained_tokens_total"), "tokens trained/s"),
               (_rate("streamrl_actor_tokens_generated_total"), "tokens generated/s")], "ops"),
        Panel("timeseries", "Learner step time by phase", "Share of learner wall time in each phase (stacked to 1).",
              [(_rate("streamrl_learner_phase_seconds_total", "phase"), "{{phase}}")], "percentunit", stack=True),
        Panel("timeseries", "Weight sync",
              "Time to gather and broadcast one version (learner) and to load it (actors), p90.",
              [(_quantile(0.9, "streamrl_weight_publish_seconds"), "publish p90"),
               (_quantile(0.9, "streamrl_actor_weight_apply_seconds"), "apply p90 (actors)")], "s"),
        Panel("timeseries", "Groups: received, used, dropped, rejected", "Per second; dropped and rejected by reason.",
              [(_rate("streamrl_groups_received_total"), "received"),
               (_rate("streamrl_groups_used_total"), "used"),
               (_rate("streamrl_groups_dropped_total", "reason"), "dropped {{reason}}"),
               (_rate("streamrl_messages_rejected_total", "reason"), "rejected {{reason}}")], "ops"),
        Panel("stat", "Policy version", "Learner policy version.",
              [(f"max by (run) (streamrl_policy_version{L})", "{{run}}")], w=6, h=4),
        Panel("stat", "Actors up", "Actor processes Prometheus can scrape.",
              [('sum(up{job="streamrl-actors"})', "actors up")], w=6, h=4),
        Panel("stat", "Weights published",
              "Bytes per second of weights sent (one copy): whole versions (full) and "
              "differences from the previous one (delta, transport.weights_delta) apart.",
              [(_rate("streamrl_weight_publish_bytes_total", "run, kind"), "{{run}} {{kind}}")], "Bps", w=6, h=4),
        Panel("stat", "Groups dropped", "Valid groups not trained on since the learner started, all reasons.",
              [(f"sum by (run) (streamrl_groups_dropped_total{L})", "{{run}}")], w=6, h=4),
    ]),
    Row("Actor $actor", repeat="actor", panels=[
        Panel("timeseries", "Generation throughput", "Completion tokens per second generated by this actor.",
              [(f"rate(streamrl_actor_tokens_generated_total{A}[{RI}])", "{{actor}}"),
               (f"streamrl_actor_generation_tokens_per_second{A}", "last call {{actor}}")], "ops", w=6),
        Panel("timeseries", "Time blocked and waiting",
              "Share of wall time blocked on a full send queue and waiting for weights.",
              [(f"rate(streamrl_actor_send_blocked_seconds_total{A}[{RI}])", "{{actor}} send blocked"),
               (f"rate(streamrl_actor_weights_wait_seconds_total{A}[{RI}])", "{{actor}} waiting for weights"),
               (f"rate(streamrl_actor_generate_seconds_total{A}[{RI}])", "{{actor}} generating")], "percentunit", w=6),
        Panel("timeseries", "Policy version: learner vs actor",
              "The learner's version and the one this actor generates with. Learner and actors are scraped at "
              "different moments, so with steps much shorter than the scrape interval the gap is noise.",
              [(f"max by (run) (streamrl_policy_version{L})", "learner"),
               (f"streamrl_actor_policy_version{A}", "{{actor}}")], w=6),
        Panel("timeseries", "Groups sent", "Scored groups per second handed to the learner.",
              [(f"rate(streamrl_actor_groups_sent_total{A}[{RI}])", "{{actor}}")], "ops", w=6),
    ]),
    Row("Multi-turn episodes", [  # task.environment; all actors
        Panel("timeseries", "Turns per episode", "Model turns per episode: mean, and the p90 over the interval.",
              [(_mean("streamrl_actor_episode_turns"), "mean"),
               (_quantile(0.9, "streamrl_actor_episode_turns"), "p90")], w=6),
        Panel("timeseries", "Tool calls",
              "Tool calls per second by tool and outcome (ok, raised, timeout, unknown_tool, bad_call).",
              [(_rate("streamrl_actor_tool_calls_total", "tool, outcome"), "{{tool}} {{outcome}}")], "ops", w=6),
        Panel("timeseries", "Time in tools",
              "Tool seconds over episode seconds (both summed over episodes; tools overlap generation).",
              [(f"{_rate('streamrl_actor_tool_seconds_total')} / {_rate('streamrl_actor_episode_seconds_total')}",
                "share in tools")], "percentunit", w=6),
        Panel("timeseries", "Truncated episodes and template drift",
              "Episodes cut short per second by reason (max_turns, max_seq_len), and turns whose chat-template "
              "rendering disagreed with the tokens held.",
              [(_rate("streamrl_actor_episodes_truncated_total", "reason"), "truncated: {{reason}}"),
               (_rate("streamrl_actor_episodes_template_drift_total"), "template drift")], "ops", w=6),
    ]),
]
"""The dashboard, row by row: `build` lays the panels out left to right in this order."""


def target(expr: str, legend: str, ref: str, fmt: str = "time_series") -> dict:
    return {"expr": expr, "legendFormat": legend, "refId": ref, "format": fmt, "datasource": DS}


def timeseries(p: Panel) -> dict:
    custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 30 if p.stack else 0, "showPoints": "never",
              "stacking": {"mode": "normal" if p.stack else "none", "group": "A"}, "spanNulls": True}
    if p.log:
        custom["scaleDistribution"] = {"type": "log", "log": 10}
    return {"type": "timeseries", "title": p.title, "description": p.description,
            "targets": [target(e, lg, chr(65 + i)) for i, (e, lg) in enumerate(p.targets)],
            "fieldConfig": {"defaults": {"unit": p.unit, "custom": custom}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}}}


def heatmap(p: Panel) -> dict:
    (expr, legend), = p.targets
    return {"type": "heatmap", "title": p.title, "description": p.description,
            "targets": [target(expr, legend, "A", fmt="heatmap")],
            "options": {"calculate": False, "yAxis": {"unit": p.unit}, "cellGap": 1,
                        "color": {"mode": "scheme", "scheme": "Blues", "steps": 64}},
            "fieldConfig": {"defaults": {}, "overrides": []}}


def stat(p: Panel) -> dict:
    (expr, legend), = p.targets
    return {"type": "stat", "title": p.title, "description": p.description, "targets": [target(expr, legend, "A")],
            "options": {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value", "graphMode": "area"},
            "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []}}


KINDS = {"timeseries": timeseries, "heatmap": heatmap, "stat": stat}


def _variable(name: str, label: str, query: str) -> dict:
    """A template variable whose values a PromQL label query lists (several may be picked)."""
    return {"name": name, "type": "query", "datasource": DS, "label": label, "multi": True, "includeAll": True,
            "refresh": 2, "query": {"query": query, "refId": name}, "definition": query}


def build(rows: list[Row] = ROWS) -> dict:
    p = Layout()
    for row in rows:
        p.row(row.title, row.repeat)
        for panel in row.panels:
            p.add(KINDS[panel.kind](panel), w=panel.w, h=panel.h)
    return {
        "uid": "streamrl", "title": "streamrl", "tags": ["streamrl", "rl"], "timezone": "browser",
        "schemaVersion": 39, "version": 1, "editable": True, "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source"},
            _variable("run", "Run", "label_values(streamrl_learner_steps_total, run)"),
            _variable("actor", "Actor", 'label_values(streamrl_actor_groups_generated_total{run=~"$run"}, actor)'),
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
