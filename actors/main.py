"""The actor process: newest weights → prompts → G samples each → score → PUSH to the learner.

Weights are applied between generate calls, and every group carries the policy version that
generated it. An actor stays at most `max_staleness` batches ahead of the learner (its
`staleness.Throttle`), so it waits for weights rather than make groups that would be dropped;
with `on_policy: strict` that is exactly its share of one batch per version. Its weight channel
(`actors.weights`) loads new weights between generate calls, or between decoding steps with
in-flight updates.
"""

from __future__ import annotations

import contextlib
import logging
import time

import torch
import zmq

from streamrl.actors import backends
from streamrl.actors.dealt import DealtPrompts
from streamrl.actors.evals import ActorEvals
from streamrl.actors.generation import Generation
from streamrl.actors.weights import ActorWeights
from streamrl.algo import staleness
from streamrl.comm import security
from streamrl.comm.control import Inbox
from streamrl.comm.groups import GroupSender
from streamrl.comm.sockets import endpoint
from streamrl.config import Config
from streamrl.models import model as model_lib
from streamrl.run import fingerprint
from streamrl.run.lifecycle import stop_on_signals
from streamrl.tasks import rewards
from streamrl.tasks.reward_health import UserCodeFailure
from streamrl.telemetry import actor_metrics, exporter, prometheus_metrics
from streamrl.telemetry.startup import Phases

log = logging.getLogger("streamrl.actor")


def run(cfg: Config, index: int = 0, learner_host: str | None = None, phases: Phases | None = None) -> dict:
    """phases: the start-up marks (`streamrl actor` passes its own; they start at the spawn)."""
    actor_id = f"actor-{index}"
    phases, stop, started = phases or Phases(actor_id), stop_on_signals(), time.perf_counter()
    _seed(cfg, index)
    stats: dict = {"actor_id": actor_id, "groups_generated": 0, "groups_sent": 0}
    with contextlib.ExitStack() as closing:  # each resource's close is registered as it is made; they run in reverse
        reward = rewards.build(cfg)
        closing.callback(reward.close)  # reward functions' threads (an abandoned call may still run)
        model, tokenizer = model_lib.build(cfg, reward.task.vocabulary)
        phases.mark("model")
        backend = backends.build(cfg.actors.backend, cfg, model, tokenizer, index)  # the engine seeds with seed + index
        closing.callback(backend.close)  # an engine's worker processes go with the actor
        telemetry, health, stopping = _monitoring(cfg, index, actor_id, stop, closing)
        sender, inbox, weights = _channels(cfg, index, learner_host, backend, model, telemetry, health, stats, closing)
        closing.push(_tell_broken(sender))  # a broken reward function: the learner stops the run with its cause
        # An engine (vllm, sglang) holds its own copy: this host copy (32 GB at 8B in fp32) must not live on
        # beside it for the whole run. The hf backend generates with it, and keeps it.
        del model
        # The learner takes this actor's share of each batch per version; the throttle keeps it within the bound.
        throttle = staleness.Throttle(cfg.learner.batch_groups, cfg.actors.num, index, cfg.max_staleness,
                                      enabled=cfg.actors.throttle or cfg.strict)
        telemetry.share.set(throttle.share)
        phases.mark("ready")
        evals = ActorEvals(cfg, actor_id, backend, tokenizer, reward, weights, sender, inbox)
        closing.callback(_report, stats, started, sender, inbox, backend, evals)
        weights.first(stopping)                                        # never generate before holding weights
        phases.mark("first_weights")
        throttle.weights(weights.version, weights.life)
        # task.epochs: the learner deals the prompts; two calls' worth in hand beyond the current one hide its steps
        dealt = (DealtPrompts(inbox, reward.task, actor_id, sender.session, 2 * cfg.actors.prompts_per_generate,
                              stopping) if cfg.task.epochs else None)
        generate = Generation(cfg, index, throttle.start_version, backend, tokenizer, reward, telemetry, dealt, health)
        closing.callback(_close_generation, generate, stats)
        while not stopping() and inbox.shutdown is None:
            weights.update()                                           # newest weights, between generate calls
            evals.run(stopping)                                        # the learner's eval requests, on this engine
            if (pace := inbox.take_pace()) is not None:  # the learner's lead (drift) and who shares a batch
                throttle.pace(pace.version, pace.lead, pace.actors)
            throttle.weights(weights.version, weights.life)
            throttle.relax()  # no demand for a while: the missing actors are back (or others took over)
            telemetry.share.set(throttle.share)
            if (budget := throttle.budget()) == 0:  # further groups would arrive too stale: wait for the learner
                if not weights.wait_newer(stopping) and (demand := inbox.take_demand(weights.version)) is not None:
                    throttle.demand(demand.count_for(actor_id))        # an actor is missing: cover what it asks
                    stats["share"] = throttle.share
                continue
            groups = generate(budget, weights.version, weights.in_flight)  # prompts → G samples each → score
            throttle.made(sum(g.layer == 1 for g in groups))           # layer-2 groups ride beside them
            stats["groups_generated"] += len(groups)
            stats["groups_sent"] += (sent := _send_all(sender, weights, inbox, groups, stopping,
                                                       cfg.actors.send_timeout_s))
            telemetry.observe_sent(sent, sender.blocked_s)             # → PUSH to the learner
            if sent and not phases.written:
                phases.mark("first_group")
                phases.done(cfg.run_path, log)
    if inbox.refused is not None:
        raise RuntimeError(f"the learner refused this actor: {inbox.refused}")
    log.info("%s: done %s", actor_id, stats)
    return stats


def _seed(cfg: Config, index: int) -> None:
    if cfg.actors.threads:
        torch.set_num_threads(cfg.actors.threads)
    torch.manual_seed(cfg.seed * 1000 + index + 1)


def _channels(cfg: Config, index: int, learner_host: str | None, backend, model, telemetry, health, stats: dict,
              closing: contextlib.ExitStack) -> tuple[GroupSender, Inbox, ActorWeights]:
    """The actor's ends of the group, control and weight channels, each closed by `closing` (before the context)."""
    host, t, actor_id = learner_host or cfg.transport.host, cfg.transport, f"actor-{index}"
    ctx = zmq.Context()
    closing.callback(ctx.term)
    curve = security.actor_curve(t.curve_keys, actor_id) if t.curve_keys else None
    sender = GroupSender(ctx, endpoint(host, t.group_port), t.send_hwm, actor_id, curve, t.batch_max_bytes)
    # Lingering lets the report and any queued groups reach a learner that is draining (one already gone costs it).
    closing.callback(sender.close, linger_s=2.0)
    # The fingerprint goes with every weight request: the learner refuses an actor set up for another run.
    inbox = Inbox(ctx, endpoint(host, t.weights_request_port), actor_id, t.max_message_bytes, curve,
                  fingerprint.of(cfg))
    closing.callback(inbox.close)
    weights = ActorWeights(cfg, ctx, host, index, curve, backend, model, telemetry, health, inbox)
    closing.callback(lambda: (weights.close(), stats.update(weights.report())))
    log.info("%s: up (%s backend); asking the learner at %s for weights", actor_id, cfg.actors.backend, host)
    return sender, inbox, weights


def _report(stats: dict, started: float, sender: GroupSender, inbox: Inbox, backend, evals: ActorEvals) -> None:
    """The session's stats, and the report that closes its accounting at the learner (after every group it sent)."""
    stats.update(wall_s=time.perf_counter() - started, send_blocked_s=round(sender.blocked_s, 3),
                 session=sender.session, **evals.report(), **_engine_stats(backend))
    reason = inbox.shutdown.reason if inbox.shutdown is not None else "stopped"
    stats["reported"] = sender.report(stats["groups_generated"], reason, reward_failures={
        k.removeprefix("reward_"): v for k, v in stats.items()
        if (k.startswith("reward_") or k == "groups_unscored") and v}, episode_counts=_episode_counts(stats))


def _episode_counts(stats: dict) -> dict[str, int]:
    """Multi-turn episodes' counts for the learner's summary.json ({} without episodes)."""
    if not stats.get("episodes"):
        return {}
    return {"episodes": stats["episodes"], **{f"turns/{k}": v for k, v in stats.get("episode_turns", {}).items()},
            **{f"tool_calls/{k}": v for k, v in stats.get("tool_calls", {}).items()},
            **{f"truncated/{k}": v for k, v in stats.get("episodes_truncated", {}).items()},
            **({"step_raised": n} if (n := stats.get("episodes_step_raised")) else {})}


def _close_generation(generate: Generation, stats: dict) -> None:
    try:
        stats.update(generate.report())  # its reward-failure counts go into the report
    except UserCodeFailure:  # the call in flight failed as the last did: that one's word carries the counts
        pass
    generate.close()  # tool threads (a call past its timeout may still run)


def _tell_broken(sender: GroupSender):
    """An exit callback (ExitStack.push) that sends a UserCodeFailure ending the actor to the learner."""

    def on_exit(kind, error, tb) -> bool:
        if isinstance(error, UserCodeFailure):
            log.error("%s\n%s", error, error.traceback)
            sender.failure(error)
        return False  # the actor still exits with the error

    return on_exit


def _send_all(sender: GroupSender, weights: ActorWeights, inbox: Inbox, groups, stop, timeout_s: float) -> int:
    """Send groups (small ones several to a message), waiting out backpressure; stops early on shutdown.
    Returns how many went. Raises TimeoutError when the learner has taken nothing for timeout_s (it is
    gone, not busy)."""
    sent = 0
    for batch in sender.batches(groups):
        blocked_since = time.monotonic()
        while not sender.send_batch(batch, timeout_s=0.2):
            weights.watch()  # notice a shutdown (and keep new weights) while the learner is busy
            if stop() or inbox.shutdown is not None:
                return sent
            if time.monotonic() - blocked_since > timeout_s:
                raise TimeoutError(f"actor {sender.actor_id}: the learner has taken no group for {timeout_s:.0f}s "
                                   "(actors.send_timeout_s); is it alive?")
        sent += len(batch)
    return sent


def _monitoring(cfg: Config, index: int, actor_id: str, stop, closing: contextlib.ExitStack):
    """Prometheus metrics and /healthz (its server closed by `closing`), and `stop` as the loop asks it: every few
    hundred ms while waiting, so each ask is proof of life."""
    registry = prometheus_metrics.new_registry()
    telemetry = actor_metrics.ActorMetrics(registry, cfg.name, actor_id)
    health = exporter.Health(actor_id, cfg.monitoring.healthy_within_s, cfg.monitoring.actor_stall_s)
    port = cfg.monitoring.actor_port + index if cfg.monitoring.actor_port else 0
    server = exporter.serve(registry, health, cfg.monitoring.host, port)
    if server:
        closing.callback(server.close)

    def stopping() -> bool:
        health.beat()
        return stop()

    return telemetry, health, stopping


def _engine_stats(backend) -> dict:
    """{"engine": start time, update time, tokens/s} where the backend is an engine (vllm, sglang); {} for hf."""
    got = backend.engine_stats()
    return {"engine": got} if got is not None else {}
