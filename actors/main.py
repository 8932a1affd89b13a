"""The actor process: newest weights → prompts → G samples each → score → PUSH to the learner.

Weights are applied between generate calls, and every group carries the policy version that
generated it. An actor stays at most `max_staleness` batches ahead of the learner (see
`staleness.generation_budget`), so it waits for weights rather than make groups that would be
dropped; with `on_policy: strict` that is exactly its share of one batch per version.
"""

from __future__ import annotations

import logging
import random
import time

import torch
import zmq

from actors import backends, rollout
from streamrl import difficulty, exporter, mgrpo, prometheus_metrics, rewards, security, staleness
from streamrl import model as model_lib
from streamrl.config import Config
from streamrl.lifecycle import stop_on_signals
from streamrl.transport import GroupSender, WeightSubscriber, endpoint

log = logging.getLogger("streamrl.actor")
SHARE_RELAX_VERSIONS = 50  # versions without a demand before a raised share returns to the planned one


def run(cfg: Config, index: int = 0, learner_host: str | None = None) -> dict:
    actor_id = f"actor-{index}"
    stop = stop_on_signals()
    if cfg.actors.threads:
        torch.set_num_threads(cfg.actors.threads)
    torch.manual_seed(cfg.seed * 1000 + index + 1)

    reward = rewards.build(cfg)
    task = reward.task
    model, tokenizer = model_lib.build(cfg, task.vocabulary)
    backend = backends.build(cfg.actors.backend, cfg, model, tokenizer)
    telemetry, health, server = _monitoring(cfg, index, actor_id)

    def stopping() -> bool:  # asked every few hundred ms while waiting: proof of life for /healthz
        health.beat()
        return stop()

    host, t = learner_host or cfg.transport.host, cfg.transport
    ctx = zmq.Context()
    curve = security.actor_curve(t.curve_keys, actor_id) if t.curve_keys else None
    sender = GroupSender(ctx, endpoint(host, t.group_port), t.send_hwm, actor_id, curve, t.batch_max_bytes)
    weights = WeightSubscriber(ctx, endpoint(host, t.weights_port), endpoint(host, t.weights_request_port),
                               actor_id, t.max_message_bytes, curve)
    sync = None
    if t.weight_sync == "collective":  # joins the learner's group in the background; zmq until it has formed
        from streamrl.weight_sync import ActorSync

        # Subscribed first: the learner announces its first collective version as soon as the group forms.
        sync = ActorSync(host, t.weight_sync_port, index, cfg.actors.num, t.weight_sync_timeout_s,
                         t.weight_sync_rendezvous_s, model.state_dict())
        weights.collective = sync.receive
    # The learner takes this many groups per version from each actor: the batch split exactly (16
    # over 3 actors is 6, 5, 5; rounding every share up would make surplus groups that go stale).
    share = base_share = staleness.planned_share(cfg.learner.batch_groups, cfg.actors.num, index)
    last_demand = 0
    telemetry.share.set(share)
    started = time.perf_counter()
    stats = {"actor_id": actor_id, "groups_sent": 0, "versions_applied": 0, "weights_wait_s": 0.0,
             "generate_s": 0.0}
    version = start_version = produced = restarts = filtered_in_a_row = 0
    tracker = None
    throttle = cfg.actors.throttle or cfg.strict

    def apply(got) -> None:
        nonlocal version, start_version, produced, restarts
        t0 = time.perf_counter()
        backend.load_weights(got[1])
        version = got[0]
        stats["versions_applied"] += 1
        if weights.learner_restarts != restarts:  # a resumed learner: the staleness budget starts again
            restarts, start_version, produced = weights.learner_restarts, version, 0
        telemetry.observe_weights(version, time.perf_counter() - t0)
        health.beat(policy_version=version)

    held = None  # weights from a restarted learner, seen mid-generation: the main loop resyncs to them

    def between_steps() -> int:
        """In-flight updates: newer weights land between decoding steps (the KV cache stays)."""
        nonlocal held
        newer = weights.poll(0)
        if newer is not None and weights.learner_restarts != restarts:
            held = newer
        elif newer is not None and newer[0] > version:
            apply(newer)
            stats["inflight_loads"] = stats.get("inflight_loads", 0) + 1
        return version

    try:
        # never generate before holding the learner's weights
        got = _wait(weights, 0, cfg, stopping, stats, telemetry, ask_first=True)
        if got is not None:
            apply(got)
            start_version = version
            log.info("%s: starting at policy version %d", actor_id, version)
        # The prompt stream's position: an actor that (re)joins a run at version v > 0 draws a stream
        # of its own rather than replaying the prompts its first life drew from the start.
        rng = random.Random(cfg.seed * 1000 + index + 1 + 7919 * start_version)
        # Multi-layer GRPO's phrases come from a stream of their own, so the prompt stream stays as it was.
        phrase_rng = random.Random(f"phrases-{cfg.seed}-{index}-{start_version}")
        options = rollout.RolloutOptions.from_config(cfg)
        # Online difficulty filtering: prompts almost always or almost never solved stop being drawn.
        tracker = difficulty.SuccessTracker.from_config(cfg) if cfg.difficulty.online else None
        observe = (lambda pid, rs: tracker.observe(pid, rs, cfg.advantage.r_min_correct)) if tracker else None
        while not stopping() and weights.shutdown is None:
            newer, held = held or weights.poll(0), None
            if newer is not None and (newer[0] > version or weights.learner_restarts != restarts):
                apply(newer)
            if share > base_share and version - last_demand >= SHARE_RELAX_VERSIONS:
                # No demand for a while: the missing actors are back (or others took over).
                share, start_version, produced = base_share, version, 0
                telemetry.share.set(share)
            budget = staleness.generation_budget(version, start_version, produced, share,
                                                 cfg.effective_max_staleness) if throttle else 1 << 30
            if budget == 0:  # further groups would arrive too stale: wait for the learner
                got = _wait(weights, version + 1, cfg, stopping, stats, telemetry)
                if got is not None:
                    apply(got)
                elif (demand := weights.take_demand(version)) is not None:  # fewer actors than planned
                    share = min(cfg.learner.batch_groups, share + demand.groups_missing)
                    # The budget counts from here: a larger share must not apply to versions already past.
                    start_version, produced, last_demand = version, 0, version
                    stats["share"] = share
                    telemetry.share.set(share)
                continue
            t0 = time.perf_counter()
            prompts = rollout.sample_prompts(task, rng, min(cfg.actors.prompts_per_generate, budget),
                                             keep=tracker.keep if tracker else None)
            if not prompts:  # online difficulty filtering excluded (nearly) every prompt it drew
                log.warning("%s: difficulty filtering excludes nearly every prompt (%s); widen difficulty.low/high",
                            actor_id, tracker.excluded_by_reason)
                time.sleep(1.0)
                continue
            groups, done = rollout.make_groups(backend, tokenizer, reward, prompts, options, version, actor_id,
                                               phrase_rng, observe=observe,
                                               between_steps=between_steps if cfg.actors.inflight_updates else None)
            if len(groups) > budget:  # layer-2 groups can outgrow the budget: beyond it they would go stale
                done.over_budget = len(groups) - budget  # the layers share the budget (mgrpo.layer2_share)
                groups = mgrpo.fill_budget(groups, budget, cfg.mgrpo.layer2_share)
            stats["generate_s"] += (gen_s := time.perf_counter() - t0)
            telemetry.observe_generate(groups, gen_s)
            telemetry.observe_rollout(done)
            for key in done.__struct_fields__:
                stats[key] = stats.get(key, 0) + getattr(done, key)
            filtered_in_a_row = 0 if groups else filtered_in_a_row + done.filtered_zero_variance
            if filtered_in_a_row and filtered_in_a_row % 100 < done.filtered_zero_variance:
                log.warning("%s: the last %d groups all had equal rewards and were filtered "
                            "(actors.filter_zero_variance); nothing reaches the learner until rewards vary",
                            actor_id, filtered_in_a_row)
            produced += len(groups)
            stats["groups_sent"] += (sent := _send_all(sender, weights, groups, stopping, cfg.actors.send_timeout_s))
            telemetry.observe_sent(sent, sender.blocked_s)
    finally:
        stats["wall_s"] = time.perf_counter() - started
        stats["send_blocked_s"] = round(sender.blocked_s, 3)
        stats["rejected"] = dict(weights.rejected.counts)
        stats["session"] = sender.session
        if sync:
            sync.close()
            stats["weight_sync"] = sync.report()
        if tracker:
            stats["prompts_excluded"] = dict(tracker.excluded_by_reason)
        if hasattr(backend, "engine_stats"):  # engines (vllm) report start time, update time, tokens/s
            stats["engine"] = backend.engine_stats()
        # The report closes this session's accounting at the learner; lingering lets it and any
        # queued groups reach a learner that is draining (a learner already gone costs the wait).
        reason = weights.shutdown.reason if weights.shutdown is not None else "stopped"
        stats["reported"] = sender.report(produced, reason)
        sender.close(linger_s=2.0)
        weights.close()
        ctx.term()
        if server:
            server.close()
        if hasattr(backend, "close"):  # an engine's worker processes go with the actor
            backend.close()
    log.info("%s: done %s", actor_id, stats)
    return stats


def _send_all(sender: GroupSender, weights: WeightSubscriber, groups, stop, timeout_s: float) -> int:
    """Send groups (small ones several to a message), waiting out backpressure; stops early on shutdown.
    Returns how many went. Raises TimeoutError when the learner has taken nothing for timeout_s (it is
    gone, not busy)."""
    sent = 0
    for batch in sender.batches(groups):
        blocked_since = time.monotonic()
        while not sender.send_batch(batch, timeout_s=0.2):
            weights.watch()  # notice a shutdown (and keep new weights) while the learner is busy
            if stop() or weights.shutdown is not None:
                return sent
            if time.monotonic() - blocked_since > timeout_s:
                raise TimeoutError(f"actor {sender.actor_id}: the learner has taken no group for {timeout_s:.0f}s "
                                   "(actors.send_timeout_s); is it alive?")
        sent += len(batch)
    return sent


def _wait(weights: WeightSubscriber, min_version: int, cfg: Config, stop, stats, telemetry: prometheus_metrics.ActorMetrics,
          ask_first: bool = False):
    t0 = time.perf_counter()
    try:
        return weights.wait_for(min_version, cfg.actors.weights_timeout_s, ask_first=ask_first, stop=stop)
    finally:
        stats["weights_wait_s"] += (waited := time.perf_counter() - t0)
        telemetry.weights_wait.inc(waited)


def _monitoring(cfg: Config, index: int, actor_id: str):
    registry = prometheus_metrics.new_registry()
    telemetry = prometheus_metrics.ActorMetrics(registry, cfg.name, actor_id)
    health = exporter.Health(actor_id, cfg.monitoring.healthy_within_s)
    port = cfg.monitoring.actor_port + index if cfg.monitoring.actor_port else 0
    return telemetry, health, exporter.serve(registry, health, cfg.monitoring.host, port)

