"""The actor's Prometheus metrics (names, labels, buckets); the learner's are in prometheus_metrics.py, beside the
pieces both share. Every actor series has the labels `run` and `actor`."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from streamrl.comm.codec import ScoredGroup
from streamrl.telemetry.prometheus_metrics import SECONDS_BUCKETS, TURN_BUCKETS, _Labelled, _Totals


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
        self.filtered = m.counter("streamrl_actor_groups_filtered_total",
                                  "Groups dropped by dynamic filtering (all rewards equal)")
        self.extra_samples = m.counter("streamrl_actor_extra_samples_total",
                                       "Samples drawn beyond G by dynamic rollouts")
        self.unparseable = m.counter("streamrl_actor_unparseable_total",
                                     "Completions the reward could not parse (scored lowest)")
        self.reward_failures = m.counter("streamrl_actor_reward_failures_total",
                                         "Samples the task's reward functions left unscored, by reason", ("reason",))
        self.groups_unscored = m.counter("streamrl_actor_groups_unscored_total",
                                         "Groups not sent because no sample in them could be scored")
        self.corrections = m.counter("streamrl_actor_corrections_total",
                                     "Multi-layer GRPO: corrections sampled (one per layer-1 response)")
        self.corrections_kept = m.counter("streamrl_actor_corrections_kept_total",
                                          "Multi-layer GRPO: corrections the verifier found correct")
        self.layer2_unsent = m.counter("streamrl_actor_layer2_unsent_total",
                                       "Multi-layer GRPO: layer-2 groups not sent because their layer-1 group was not")
        self.policy_version = m.gauge("streamrl_actor_policy_version", "Policy version the actor generates with")
        self.share = m.gauge("streamrl_actor_share_groups", "Groups this actor makes per learner version")
        self.last_progress = m.gauge("streamrl_actor_last_progress_timestamp_seconds",
                                     "Unix time the actor last sent a group or applied weights")
        # Multi-turn episodes with tools (task.environment; actors/environment_episodes.py).
        self.episode_turns = m.histogram("streamrl_actor_episode_turns", "Model turns per multi-turn episode",
                                         TURN_BUCKETS)
        self.tool_calls = m.counter("streamrl_actor_tool_calls_total", "Tool calls by tool and outcome",
                                    ("tool", "outcome"))
        self.tool_seconds = m.counter("streamrl_actor_tool_seconds_total",
                                      "Seconds tool calls ran (summed over calls, which overlap generation)")
        self.episode_seconds = m.counter("streamrl_actor_episode_seconds_total",
                                         "Seconds episodes were in flight (summed over episodes)")
        self.episodes_truncated = m.counter("streamrl_actor_episodes_truncated_total",
                                            "Episodes cut short, by reason (max_turns, max_seq_len)", ("reason",))
        self.template_drift = m.counter("streamrl_actor_episodes_template_drift_total",
                                        "Episode turns whose chat-template rendering disagreed with the ids held")
        self.endpoint_refused = m.counter("streamrl_actor_endpoint_refused_total",
                                          "Requests the agent endpoint refused itself, by code (unauthorized, ...)",
                                          ("code",))
        for why in ("max_turns", "max_seq_len"):  # at 0 from the start: a panel shows "none", not "no data"
            self.episodes_truncated.labels(reason=why)

        self._totals = _Totals()

    def observe_generate(self, groups: list[ScoredGroup], seconds: float) -> None:
        tokens = sum(int(g.completion_tokens.size) for g in groups)
        self.groups.inc(len(groups))
        self.samples.inc(sum(g.group_size for g in groups))
        self.tokens.inc(tokens)
        self.generate_seconds.inc(seconds)
        if seconds > 0:
            self.throughput.set(tokens / seconds)

    def observe_rollout(self, stats) -> None:
        """stats: actors.rollout.RolloutStats of one rollout step."""
        self.filtered.inc(stats.filtered_zero_variance)
        self.extra_samples.inc(stats.extra_samples)
        self.unparseable.inc(stats.unparseable)
        for why in ("raised", "timeout", "bad_return", "non_finite", "out_of_scale", "none", "no_model_call", "bad_data"):
            if n := getattr(stats, f"reward_{why}", 0):
                self.reward_failures.labels(reason=why).inc(n)
        self.groups_unscored.inc(getattr(stats, "groups_unscored", 0))
        self.corrections.inc(stats.corrections)
        self.corrections_kept.inc(stats.corrections_kept)
        self.layer2_unsent.inc(stats.layer2_unsent)

    def observe_episodes(self, stats) -> None:
        """stats: actors.episodes.EpisodeStats of one generate call. The share of time in tools is
        tool_seconds_total / episode_seconds_total (a ratio of rates on the dashboard)."""
        for turns in stats.turns:
            self.episode_turns.observe(turns)
        for key, n in stats.tool_calls.items():
            tool, _, outcome = key.rpartition("/")
            self.tool_calls.labels(tool=tool, outcome=outcome).inc(n)
        self.tool_seconds.inc(stats.tool_s)
        self.episode_seconds.inc(stats.episode_s)
        for why, n in stats.truncated.items():
            self.episodes_truncated.labels(reason=why).inc(n)
        self.template_drift.inc(stats.template_drift)
        for code, n in stats.endpoint_refused.items():
            self.endpoint_refused.labels(code=code).inc(n)

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
