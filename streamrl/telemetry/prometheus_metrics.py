"""The Prometheus metrics of the learner, and what the actors' (actor_metrics.py) share: names, labels, buckets
(docs/concepts/architecture.md, "Metric definitions").

Dashboards and alert rules in monitoring/ query these names; metrics.jsonl carries the same
per-step values under the names without the `streamrl_` prefix. Every series has a `run` label;
learner series also `estimator`, actor series `actor`. Counters restart at 0 with their process,
which Prometheus's rate() and increase() read as a reset, not as a drop.
"""

from __future__ import annotations

import threading
import time

import msgspec
import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.process_collector import ProcessCollector

from streamrl.algo import staleness
from streamrl.telemetry.exporter import WeightedHistogram

IS_RATIO_BUCKETS = (0.5, 0.8, 0.9, 0.95, 0.99, 0.999, 1.001, 1.01, 1.05, 1.1, 1.25, 1.5, 2.0, 5.0)
SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# *_created series double what a scrape carries and no panel or rule reads them (process-wide switch).
disable_created_metrics()

TURN_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 32)
FLUSH_EVERY = 64  # steps whose histogram arrays wait for a scrape before the learner bins them itself
DROP_REASONS = ("stale", "future", "wrong_group_size")


def new_registry() -> CollectorRegistry:
    """A registry of this process's own, with its CPU, memory and start time (process_*)."""
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    return registry


class _Labelled:
    """Creates metrics that all carry the same constant labels."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]):
        self.registry, self.labels = registry, labels

    def gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(name, doc, list(self.labels), registry=self.registry).labels(**self.labels)

    def counter(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
        """extra: labels beyond the constant ones, given at each `.labels(...)` call (the counter then comes back
        unlabelled by them)."""
        made = Counter(name, doc, [*self.labels, *extra], registry=self.registry)
        return _Partial(made, self.labels) if extra else made.labels(**self.labels)

    def histogram(self, name: str, doc: str, buckets) -> Histogram:
        return Histogram(name, doc, list(self.labels), buckets=buckets, registry=self.registry).labels(**self.labels)

    def weighted_histogram(self, name: str, doc: str, buckets) -> WeightedHistogram:
        """Not registered: its owner bins pending arrays first, then collects it."""
        return WeightedHistogram(None, name, doc, buckets, self.labels)


class _Partial:
    """A labelled metric with its constant labels filled in: `.labels(reason=...)` adds the rest."""

    def __init__(self, metric, labels: dict[str, str]):
        self.metric, self.constant = metric, labels

    def labels(self, **more: str):
        return self.metric.labels(**self.constant, **more)


class _Totals:
    """Turns cumulative counts kept elsewhere (the actor's sender) into counter increments."""

    def __init__(self):
        self.seen: dict[tuple, float] = {}

    def add(self, counter, key: tuple, total: float) -> None:
        delta = total - self.seen.get(key, 0)
        if delta > 0:
            counter.inc(delta)
            self.seen[key] = total


# Per-step values, read from the step's metrics.jsonl record when Prometheus scrapes:
# (metric, help, record key). Non-finite values (r_count with no negatives) are exported as such.
STEP_GAUGES = (
    ("streamrl_advantage_pos_neg_count_ratio",
     "r_count: samples with A>0 per sample with A<0 in the last batch (+Inf: none negative)", "r_count"),
    ("streamrl_advantage_pos_neg_loss_ratio",
     "r_loss: summed |loss| of A>0 samples over that of A<0 samples in the last batch", "r_loss"),
    ("streamrl_failed_positive_fraction", "Share of the last batch's samples with R < R_min_correct and A > 0",
     "failed_positive_fraction"),
    ("streamrl_corpo_phase_fraction", "Share of the last batch's groups with mean reward below R_min_correct",
     "corpo_phase_fraction"),
    ("streamrl_reward_mean", "Mean reward of the last batch", "reward_mean"),
    ("streamrl_success_rate", "Share of the last batch's samples with R >= R_min_correct", "success_rate"),
    # The name predates `learner_version` in metrics.jsonl; dashboards and alerts query it, so it stays.
    ("streamrl_policy_version", "Learner policy version (one per optimizer step)", "learner_version"),
    ("streamrl_loss", "Policy loss of the last step", "loss"),
    ("streamrl_learning_rate", "Learning rate of the last step", "lr"),
    ("streamrl_grad_norm", "Gradient norm of the last step (before clipping)", "grad_norm"),
    ("streamrl_clipped_token_fraction", "Share of the last batch's tokens whose ratio was clipped",
     "clipped_fraction"),
    ("streamrl_truncated_token_fraction",
     "Share of the last batch's tokens whose importance weight the objective capped (tis, seq_mask, decoupled_ppo)",
     "truncated_fraction"),
    ("streamrl_masked_token_fraction",
     "Share of the last batch's tokens an importance-sampling mask took out (mis/icepop, seq_mask, m2po)",
     "masked_fraction"),
    ("streamrl_importance_ess_fraction",
     "Effective sample size of the last batch's token importance weights over its tokens, (sum w)^2 / (N sum w^2)",
     "is_ess_fraction"),
    ("streamrl_step_scale",
     "Multiplier on the last step's learning rate: its importance weights' ESS scale (loss.variance_control) times "
     "the drift scale (optim.target_drift); else 1",
     "step_scale"),
    ("streamrl_drift_per_version",
     "KL(previous version || next) per token, measured on the last batch's stale groups (optim.target_drift)",
     "drift_per_version"),
    ("streamrl_behaviour_learner_kl", "KL(behaviour || learner) estimated (k3) over the last batch's tokens",
     "kl_behaviour_learner"),
    ("streamrl_inflight_sample_fraction",
     "Share of the last batch's samples whose tokens came from more than one policy version (in-flight updates)",
     "inflight_fraction"),
)
# Sums over steps: (metric, help, label or None, {label value or None: record key or None for 1 per step}).
STEP_COUNTERS = (
    ("streamrl_learner_steps", "Optimizer steps taken", None, {None: None}),
    ("streamrl_trained_samples", "Samples trained on", None, {None: "samples"}),
    ("streamrl_trained_tokens", "Completion tokens trained on", None, {None: "tokens"}),
    ("streamrl_advantages", "Samples trained on, by advantage sign", "sign",
     {"positive": "adv_pos", "negative": "adv_neg", "zero": "adv_zero"}),
    ("streamrl_failed_positive_samples", "Samples with R < R_min_correct that got A > 0 (never under corpo or static)",
     None, {None: "failed_positive"}),
    ("streamrl_learner_phase_seconds", "Learner wall time by phase of the step", "phase",
     {"wait_for_data": "wait_s", "batch": "batch_s", "forward_backward": "fwd_bwd_s", "optimizer": "optimizer_s",
      "publish": "publish_s"}),
)
# Cumulative intake accounting (Intake.accounting()): (metric, help, key, label for dict-valued keys).
ACCOUNTING_COUNTERS = (
    ("streamrl_groups_received", "Scored groups that decoded and validated", "groups_received", None),
    ("streamrl_groups_used", "Scored groups trained on", "groups_used", None),
    ("streamrl_groups_dropped", "Valid groups not trained on, by reason", "groups_dropped", "reason"),
    ("streamrl_messages_rejected", "Messages that failed validation, by reason", "messages_rejected", "reason"),
    ("streamrl_weight_requests_served", "Actors' requests for the newest weights answered",
     "weight_requests_served", None),
    ("streamrl_demands_sent", "Times the learner asked held-back actors for groups", "demands_sent", None),
    ("streamrl_peers_refused", "Connections refused by CURVE authentication (key not authorized)",
     "peers_refused", None),
)


class LearnerMetrics:
    """The learner's series. A step only stores its record and bins its arrays (tens of µs); the
    gauges and counters are built from that snapshot when Prometheus scrapes, off the step path."""

    def __init__(self, registry: CollectorRegistry, run: str, estimator: str, reward_buckets, max_staleness: int,
                 settings: dict[str, str] | None = None):
        m = _Labelled(registry, {"run": run, "estimator": estimator})
        self.labels = m.labels
        Info("streamrl_run", "The run's settings", list(m.labels), registry=registry).labels(**m.labels).info(
            settings or {})
        self._lock = threading.Lock()
        self._last: dict = {}
        self._sum_keys = [((name, value), key) for name, _, _, keys in STEP_COUNTERS for value, key in keys.items()]
        self._sums = {name_value: 0.0 for name_value, _ in self._sum_keys}
        self._accounting: dict = {"groups_dropped": dict.fromkeys(DROP_REASONS, 0)}
        self._last_step = time.time()  # before the first step: the start, so "stalled" counts from there
        self._max_staleness = max_staleness
        # Binned in batches of steps, at scrape time or every FLUSH_EVERY steps, off the step path.
        self._pending: list[dict[str, np.ndarray]] = []
        lags = range(0, max(max_staleness, 1) + 1)
        self.reward = m.weighted_histogram("streamrl_reward", "Reward of each trained sample", reward_buckets)
        self.sample_staleness = m.weighted_histogram(
            "streamrl_sample_staleness_versions", "Lag (learner version - generating version) of each trained sample",
            lags)
        self.token_staleness = m.weighted_histogram(
            "streamrl_token_staleness_versions", "Lag of each trained completion token", lags)
        self.is_ratio = m.weighted_histogram(
            "streamrl_importance_ratio", "Importance ratio pi_learner/pi_behaviour of each trained token",
            IS_RATIO_BUCKETS)
        registry.register(self)
        self.step_seconds = m.histogram("streamrl_learner_step_seconds", "Wall time of one learner step",
                                        SECONDS_BUCKETS)
        self.publish_seconds = m.histogram("streamrl_weight_publish_seconds",
                                           "Time to gather and broadcast one weight version", SECONDS_BUCKETS)
        self.publish_bytes = m.counter("streamrl_weight_publish_bytes_total", "Bytes of weights sent (one copy): kind "
                                       "full (whole versions, re-broadcasts included) or delta "
                                       "(transport.weights_delta)", ("kind",))
        for kind in ("full", "delta"):  # both series from the start: a rate over a series that appears later is wrong
            self.publish_bytes.labels(kind=kind)
        self.eval_value = Gauge("streamrl_eval", "The newest in-training evaluation's eval/* figures (metric: the key "
                                "after eval/, e.g. code/pass@1), run on the actors' engines",
                                [*m.labels, "metric"], registry=registry)
        self.eval_version = m.gauge("streamrl_eval_policy_version", "Policy version of the newest evaluation recorded")
        self.evals = m.counter("streamrl_eval_shards_total", "Eval shards answered, by the actor that ran them",
                               ("actor",))

    def observe_eval(self, rec: dict) -> None:
        """rec: one evaluation's record (eval/* figures, eval_version, eval_actors: shards per actor)."""
        for key, value in rec.items():
            if key.startswith("eval/") and isinstance(value, (int, float)):
                self.eval_value.labels(**self.labels, metric=key.removeprefix("eval/")).set(value)
        self.eval_version.set(rec["eval_version"])
        for actor, shards in rec.get("eval_actors", {}).items():
            self.evals.labels(actor=actor).inc(shards)

    def observe_step(self, rec: dict | msgspec.Struct, dists: dict) -> None:
        """rec: the learner's Step (learner/step.py), or its metrics.jsonl record; dists: the step's tensors, see
        `histogram_arrays`."""
        rec = msgspec.to_builtins(rec) if isinstance(rec, msgspec.Struct) else rec
        rec = {**rec, "failed_positive": round(rec["failed_positive_fraction"] * rec["samples"])}
        with self._lock:
            self._last, self._last_step = rec, time.time()
            for name_value, key in self._sum_keys:
                self._sums[name_value] += 1 if key is None else rec[key]
            self._pending.append(dists)
            flush = len(self._pending) >= FLUSH_EVERY  # nobody scrapes: keep memory bounded
        if flush:
            self._flush()
        self.step_seconds.observe(rec["step_s"])

    def _flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        if pending:
            arrays = [histogram_arrays(**d) for d in pending]
            joined = {k: np.concatenate([a[k] for a in arrays]) for k in arrays[0]}
            self.reward.observe(joined["reward"])
            self.sample_staleness.observe(joined["lag"])
            self.token_staleness.observe(joined["lag"], weights=joined["tokens"])
            self.is_ratio.observe(joined["is_ratio"])

    def observe_publish(self, seconds: float | None, sent: dict[str, int]) -> None:
        """seconds: one publish's time on the learner (None: bytes only); sent: bytes sent since the last call, by kind
        (full, delta)."""
        if seconds is not None:
            self.publish_seconds.observe(seconds)
        for kind, nbytes in sent.items():
            self.publish_bytes.labels(kind=kind).inc(nbytes)

    def observe_accounting(self, acc: dict) -> None:
        """acc: Intake.accounting(), cumulative since this process started (a fresh dict each call)."""
        acc["groups_dropped"] = {**dict.fromkeys(DROP_REASONS, 0), **acc["groups_dropped"]}
        self._accounting = acc

    def describe(self):
        return list(self._families({}, {}, {}, 0.0))

    def collect(self):
        self._flush()
        with self._lock:
            last, sums, acc, last_step = self._last, dict(self._sums), self._accounting, self._last_step
        return list(self._families(last, sums, acc, last_step))

    def _families(self, last: dict, sums: dict, acc: dict, last_step: float):
        names, values = list(self.labels), list(self.labels.values())
        for name, doc, key in STEP_GAUGES:
            g = GaugeMetricFamily(name, doc, labels=names)
            if key in last:
                g.add_metric(values, _num(last[key]))
            yield g
        for name, doc, value in (
                ("streamrl_max_staleness_versions", "The configured staleness bound (0: strict)", self._max_staleness),
                ("streamrl_last_step_timestamp_seconds",
                 "Unix time of the last optimizer step (start time before the first)", last_step)):
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(values, value)  # a bound of 0 (strict) is a value, not an absence
            yield g
        yield _census(last, names, values)
        for name, doc, label, keys in STEP_COUNTERS:
            c = CounterMetricFamily(name, doc, labels=names + ([label] if label else []))
            for value in keys:
                if (name, value) in sums:
                    c.add_metric(values + ([value] if label else []), sums[name, value])
            yield c
        for name, doc, key, label in ACCOUNTING_COUNTERS:
            c = CounterMetricFamily(name, doc, labels=names + ([label] if label else []))
            if label:
                for value, n in acc.get(key, {}).items():
                    c.add_metric(values + [value], n)
            elif key in acc:
                c.add_metric(values, acc[key])
            yield c
        for h in (self.reward, self.sample_staleness, self.token_staleness, self.is_ratio):
            yield from h.collect()


def histogram_arrays(learner_version: int, rewards, policy_versions, completion_mask, ratio) -> dict[str, np.ndarray]:
    """Per-sample reward, lag and completion tokens (B,) and per-token importance ratio (T,).

    rewards: (num_groups, G); policy_versions: (num_groups,); completion_mask, ratio: (B, L-1),
    torch tensors on any device.
    """
    G = rewards.shape[1]
    mask = completion_mask.detach().cpu().numpy() > 0
    return {"reward": rewards.detach().float().cpu().numpy().ravel(),
            "lag": np.repeat(staleness.lag(learner_version, policy_versions.cpu().numpy()), G),
            "tokens": mask.sum(-1),
            "is_ratio": ratio.detach().float().cpu().numpy()[mask]}


CENSUS_STAGES = (("after_filter", "census_"), ("before_filter", "census_before_"))
"""(stage label, record key prefix): the census of the trained samples, and with the filtered groups' samples."""


def _census(last: dict, names: list[str], values: list[str]) -> GaugeMetricFamily:
    """streamrl_sample_census_fraction{cell, stage} from the last step record: its census_* and
    census_before_* keys (the cells are whatever the record carries, so they are named in one place:
    learning_signal.CENSUS_KEYS)."""
    g = GaugeMetricFamily(
        "streamrl_sample_census_fraction",
        "Share of the last batch's samples in each census cell ({failed, passed} x {A > 0, A <= 0}), "
        "after the actors' dynamic filtering (the trained samples) and before it (with the filtered groups' samples)",
        labels=names + ["cell", "stage"])
    for stage, prefix in CENSUS_STAGES:
        for key, value in last.items():
            cell = key[len(prefix):]
            if key.startswith(prefix) and not cell.startswith("before_"):
                g.add_metric(values + [cell, stage], _num(value))
    return g


def _num(x) -> float:
    """metrics.jsonl writes non-finite values as null; Prometheus takes them as NaN."""
    return float("nan") if x is None else float(x)
