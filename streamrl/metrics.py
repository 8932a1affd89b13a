"""The Prometheus metrics of learner and actors: names, labels, buckets (DESIGN.md, "Learning-signal metrics").

Dashboards and alert rules in monitoring/ query these names; metrics.jsonl carries the same
per-step values under the names without the `streamrl_` prefix. Every series has a `run` label;
learner series also `estimator`, actor series `actor`. Counters restart at 0 with their process,
which Prometheus's rate() and increase() read as a reset, not as a drop.
"""

from __future__ import annotations

import time

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, disable_created_metrics
from prometheus_client.process_collector import ProcessCollector

from streamrl.exporter import WeightedHistogram
from streamrl.wire import ScoredGroup

IS_RATIO_BUCKETS = (0.5, 0.8, 0.9, 0.95, 0.99, 0.999, 1.001, 1.01, 1.05, 1.1, 1.25, 1.5, 2.0, 5.0)
SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# *_created series double what a scrape carries and no panel or rule reads them (process-wide switch).
disable_created_metrics()

DROP_REASONS = ("stale", "future", "wrong_group_size")
STEP_PHASES = {"wait_s": "wait_for_data", "batch_s": "batch", "fwd_bwd_s": "forward_backward",
               "optimizer_s": "optimizer", "publish_s": "publish"}


def new_registry() -> CollectorRegistry:
    """A registry of this process's own, with its CPU, memory and start time (process_*)."""
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    return registry


class _Labelled:
    """Creates metrics that all carry the same constant labels, plus optional per-series ones."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]):
        self.registry, self.labels = registry, labels

    def gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(name, doc, list(self.labels), registry=self.registry).labels(**self.labels)

    def counter(self, name: str, doc: str, by: str | None = None):
        """A bound counter, or with `by` a function label value → counter (children cached: labels() is slow)."""
        if by is None:
            return Counter(name, doc, list(self.labels), registry=self.registry).labels(**self.labels)
        parent = Counter(name, doc, [*self.labels, by], registry=self.registry)
        children: dict[str, Counter] = {}

        def child(value: str) -> Counter:
            if value not in children:
                children[value] = parent.labels(**self.labels, **{by: value})
            return children[value]
        return child

    def histogram(self, name: str, doc: str, buckets) -> Histogram:
        return Histogram(name, doc, list(self.labels), buckets=buckets, registry=self.registry).labels(**self.labels)

    def weighted_histogram(self, name: str, doc: str, buckets) -> WeightedHistogram:
        return WeightedHistogram(self.registry, name, doc, buckets, self.labels)


class _Totals:
    """Turns cumulative counts kept elsewhere (intake accounting) into counter increments."""

    def __init__(self):
        self.seen: dict[tuple, float] = {}

    def add(self, counter, key: tuple, total: float) -> None:
        delta = total - self.seen.get(key, 0)
        if delta > 0:
            counter.inc(delta)
            self.seen[key] = total


class LearnerMetrics:
    def __init__(self, registry: CollectorRegistry, run: str, estimator: str, reward_buckets, max_staleness: int,
                 settings: dict[str, str] | None = None):
        m = _Labelled(registry, {"run": run, "estimator": estimator})
        Info("streamrl_run", "The run's settings", list(m.labels), registry=registry).labels(**m.labels).info(
            settings or {})
        # Learning signal, last step (the paper's Figure 2 plots these over steps).
        self.r_count = m.gauge("streamrl_advantage_pos_neg_count_ratio",
                               "r_count: samples with A>0 per sample with A<0 in the last batch (+Inf: none negative)")
        self.r_loss = m.gauge("streamrl_advantage_pos_neg_loss_ratio",
                              "r_loss: summed |loss| of A>0 samples over that of A<0 samples in the last batch")
        self.failed_positive_fraction = m.gauge(
            "streamrl_failed_positive_fraction", "Share of the last batch's samples with R < R_min_correct and A > 0")
        self.corpo_phase_fraction = m.gauge(
            "streamrl_corpo_phase_fraction", "Share of the last batch's groups with mean reward below R_min_correct")
        self.reward_mean = m.gauge("streamrl_reward_mean", "Mean reward of the last batch")
        self.success_rate = m.gauge("streamrl_success_rate",
                                    "Share of the last batch's samples with R >= R_min_correct")
        self.advantages = m.counter("streamrl_advantages_total", "Samples trained on, by advantage sign", by="sign")
        self.failed_positive = m.counter("streamrl_failed_positive_samples_total",
                                         "Samples with R < R_min_correct that got A > 0 (never under corpo or static)")
        self.reward = m.weighted_histogram("streamrl_reward", "Reward of each trained sample", reward_buckets)
        # Staleness of what was consumed.
        lags = range(0, max(max_staleness, 1) + 1)
        self.sample_staleness = m.weighted_histogram(
            "streamrl_sample_staleness_versions", "Lag (learner version - generating version) of each trained sample",
            lags)
        self.token_staleness = m.weighted_histogram(
            "streamrl_token_staleness_versions", "Lag of each trained completion token", lags)
        self.max_staleness = m.gauge("streamrl_max_staleness_versions", "The configured staleness bound (0: strict)")
        self.max_staleness.set(max_staleness)
        # Optimisation.
        self.policy_version = m.gauge("streamrl_policy_version", "Learner policy version (one per optimizer step)")
        self.loss = m.gauge("streamrl_loss", "Policy loss of the last step")
        self.lr = m.gauge("streamrl_learning_rate", "Learning rate of the last step")
        self.grad_norm = m.gauge("streamrl_grad_norm", "Gradient norm of the last step (before clipping)")
        self.is_ratio = m.weighted_histogram(
            "streamrl_importance_ratio", "Importance ratio pi_learner/pi_behaviour of each trained token",
            IS_RATIO_BUCKETS)
        self.clipped_fraction = m.gauge("streamrl_clipped_token_fraction",
                                        "Share of the last batch's tokens whose ratio was clipped")
        # Throughput and time.
        self.steps = m.counter("streamrl_learner_steps_total", "Optimizer steps taken")
        self.samples = m.counter("streamrl_trained_samples_total", "Samples trained on")
        self.tokens = m.counter("streamrl_trained_tokens_total", "Completion tokens trained on")
        self.last_step = m.gauge("streamrl_last_step_timestamp_seconds",
                                 "Unix time of the last optimizer step (start time before the first)")
        self.last_step.set(time.time())
        self.step_seconds = m.histogram("streamrl_learner_step_seconds", "Wall time of one learner step",
                                        SECONDS_BUCKETS)
        self.phase_seconds = m.counter("streamrl_learner_phase_seconds_total",
                                       "Learner wall time by phase of the step", by="phase")
        self.publish_seconds = m.histogram("streamrl_weight_publish_seconds",
                                           "Time to gather and broadcast one weight version", SECONDS_BUCKETS)
        self.publish_bytes = m.counter("streamrl_weight_publish_bytes_total", "Bytes of weights broadcast (one copy)")
        # Intake accounting.
        self.received = m.counter("streamrl_groups_received_total", "Scored groups that decoded and validated")
        self.used = m.counter("streamrl_groups_used_total", "Scored groups trained on")
        self.dropped = m.counter("streamrl_groups_dropped_total", "Valid groups not trained on, by reason", by="reason")
        for reason in DROP_REASONS:  # present at 0 from the start, so rates and alerts see "none" rather than no data
            self.dropped(reason)
        self.rejected = m.counter("streamrl_messages_rejected_total", "Messages that failed validation, by reason",
                                  by="reason")
        self.weight_requests = m.counter("streamrl_weight_requests_served_total",
                                         "Actors' requests for the newest weights answered")
        self.demands = m.counter("streamrl_demands_sent_total", "Times the learner asked held-back actors for groups")
        self._totals = _Totals()

    def observe_step(self, rec: dict, dists: dict[str, np.ndarray]) -> None:
        """rec: the step's metrics.jsonl record; dists: per-sample reward, lag, tokens and per-token is_ratio."""
        self.r_count.set(_num(rec["r_count"]))
        self.r_loss.set(_num(rec["r_loss"]))
        self.failed_positive_fraction.set(rec["failed_positive_fraction"])
        self.corpo_phase_fraction.set(rec["corpo_phase_fraction"])
        self.reward_mean.set(rec["reward_mean"])
        self.success_rate.set(rec["success_rate"])
        for key, sign in (("adv_pos", "positive"), ("adv_neg", "negative"), ("adv_zero", "zero")):
            self.advantages(sign).inc(rec[key])
        self.failed_positive.inc(round(rec["failed_positive_fraction"] * rec["samples"]))
        self.reward.observe(dists["reward"])
        self.sample_staleness.observe(dists["lag"])
        self.token_staleness.observe(dists["lag"], weights=dists["tokens"])
        self.is_ratio.observe(dists["is_ratio"])
        self.clipped_fraction.set(rec["clipped_fraction"])
        self.policy_version.set(rec["policy_version"])
        self.loss.set(_num(rec["loss"]))
        self.lr.set(rec["lr"])
        self.grad_norm.set(_num(rec["grad_norm"]))
        self.steps.inc()
        self.samples.inc(rec["samples"])
        self.tokens.inc(rec["tokens"])
        self.last_step.set(time.time())
        self.step_seconds.observe(rec["step_s"])
        for key, phase in STEP_PHASES.items():
            self.phase_seconds(phase).inc(rec[key])

    def observe_publish(self, seconds: float, nbytes: int) -> None:
        self.publish_seconds.observe(seconds)
        self.publish_bytes.inc(nbytes)

    def observe_accounting(self, acc: dict) -> None:
        """acc: Intake.accounting(), cumulative since this process started."""
        t = self._totals
        t.add(self.received, ("received",), acc["groups_received"])
        t.add(self.used, ("used",), acc["groups_used"])
        t.add(self.weight_requests, ("requests",), acc["weight_requests_served"])
        t.add(self.demands, ("demands",), acc["demands_sent"])
        for reason, n in acc["groups_dropped"].items():
            t.add(self.dropped(reason), ("dropped", reason), n)
        for reason, n in acc["messages_rejected"].items():
            t.add(self.rejected(reason), ("rejected", reason), n)


class ActorMetrics:
    def __init__(self, registry: CollectorRegistry, run: str, actor: str):
        m = _Labelled(registry, {"run": run, "actor": actor})
        self.groups = m.counter("streamrl_actor_groups_generated_total", "Scored groups generated")
        self.samples = m.counter("streamrl_actor_samples_generated_total", "Completions generated")
        self.tokens = m.counter("streamrl_actor_tokens_generated_total", "Completion tokens generated")
        self.sent = m.counter("streamrl_actor_groups_sent_total", "Scored groups handed to the learner's queue")
        self.generate_seconds = m.counter("streamrl_actor_generate_seconds_total", "Time spent generating and scoring")
        self.throughput = m.gauge("streamrl_actor_generation_tokens_per_second",
                                  "Completion tokens per second of the last generate call")
        self.send_blocked = m.counter("streamrl_actor_send_blocked_seconds_total",
                                      "Time blocked because the learner's queue was full")
        self.weights_wait = m.counter("streamrl_actor_weights_wait_seconds_total",
                                      "Time waiting for weights (held back by the staleness bound or starting)")
        self.apply_seconds = m.histogram("streamrl_actor_weight_apply_seconds", "Time to load one weight version",
                                         SECONDS_BUCKETS)
        self.policy_version = m.gauge("streamrl_actor_policy_version", "Policy version the actor generates with")
        self.share = m.gauge("streamrl_actor_share_groups", "Groups this actor makes per learner version")
        self.last_progress = m.gauge("streamrl_actor_last_progress_timestamp_seconds",
                                     "Unix time the actor last sent a group or applied weights")

        self._totals = _Totals()

    def observe_generate(self, groups: list[ScoredGroup], seconds: float) -> None:
        tokens = sum(int(g.completion_tokens.size) for g in groups)
        self.groups.inc(len(groups))
        self.samples.inc(sum(g.group_size for g in groups))
        self.tokens.inc(tokens)
        self.generate_seconds.inc(seconds)
        if seconds > 0:
            self.throughput.set(tokens / seconds)

    def observe_sent(self, groups: int, blocked_total_s: float) -> None:
        """blocked_total_s: the sender's cumulative time blocked on a full queue."""
        self.sent.inc(groups)
        self._totals.add(self.send_blocked, ("blocked",), blocked_total_s)
        if groups:
            self.last_progress.set(time.time())

    def observe_weights(self, version: int, apply_seconds: float) -> None:
        self.apply_seconds.observe(apply_seconds)
        self.policy_version.set(version)
        self.last_progress.set(time.time())


def _num(x) -> float:
    """metrics.jsonl writes non-finite values as null; Prometheus takes them as NaN."""
    return float("nan") if x is None else float(x)
