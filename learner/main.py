"""The learner process: receive → gate → batch → advantages → DeepSpeed step → publish."""

from __future__ import annotations

import functools
import logging
import time

import torch
import zmq

from learner import checkpoints, follower, schedule, stepstats
from learner.batch import collate
from learner.engine import Engine
from learner.intake import Intake
from learner.ranks import Ranks
from learner.runlog import RunLog
from learner.weights import LearnerWeights
from streamrl import advantages, evaluation, exporter, prometheus_metrics, rewards, security, storage
from streamrl import model as model_lib
from streamrl.config import Config
from streamrl.lifecycle import stop_on_signals
from streamrl.transport import GroupReceiver, endpoint

log = logging.getLogger("streamrl.learner")


def run(cfg: Config) -> dict:
    stop = stop_on_signals()
    if cfg.learner.threads:
        torch.set_num_threads(cfg.learner.threads)
    torch.manual_seed(cfg.seed)
    reward = rewards.build(cfg)
    model, tokenizer = model_lib.build(cfg, reward.task.vocabulary)
    vocab_size = model_lib.vocab_size(model)  # before ZeRO-3 partitions the embedding away
    engine = Engine(cfg, model)
    ranks = Ranks.current()
    ckpt_dir = cfg.run_path / "checkpoints"
    resumed = checkpoints.resume(engine, ckpt_dir) if cfg.learner.resume else None  # a filesystem all ranks share
    step, learner_version = (resumed[1]["step"], resumed[1]["version"]) if resumed else (0, 0)
    if not ranks.leader:  # ranks > 0 train on their share of each batch and never touch a socket
        return follower.run(cfg, engine, ranks, str(ckpt_dir), step, learner_version)
    runlog = RunLog(cfg)
    runlog.open(resumed_step=step)
    saved_at = step

    t, L, a = cfg.transport, cfg.learner, cfg.advantage
    ctx, curve, gate, receiver = _open_sockets(cfg, vocab_size)
    telemetry, health, server = _monitoring(cfg, reward.levels)
    weights = LearnerWeights(cfg, ctx, curve, engine, telemetry)  # the weights' way out, ZeroMQ or collective
    intake = Intake(receiver, weights.publisher, cfg.actors.group_size, cfg.max_staleness, L.demand_after_s,
                    refused=(lambda: gate.refused) if gate else (lambda: 0), strict=cfg.strict)

    def checkpoint() -> None:
        nonlocal saved_at
        # The copy is done and the parameters stay the published version (a save changes nothing),
        # so weight requests are still answered from them (settle would stop that until the next publish).
        weights.flush()
        state = {"step": step, "version": learner_version, "accounting": intake.accounting()}
        checkpoints.save(runlog.checkpoints, f"step-{step}", engine.save, state, engine.full_state_dict())
        saved_at = step

    evaluator = functools.cache(lambda: evaluation.Evaluator(cfg, reward))  # a CPU copy, built at the first eval

    def stopping() -> bool:  # the intake asks every 100 ms while it waits: proof of life for /healthz
        health.beat()
        return stop()

    weights.publish(learner_version)
    health.beat(step=step, learner_version=learner_version)
    log.info("learner ready at version %d, step %d, training on %s (%d rank%s); waiting for actors on %s",
             learner_version, step, engine.device, ranks.world, "s" if ranks.world > 1 else "", t.group_port)
    started = time.time()
    error: BaseException | None = None  # what ended the run early, for summary.json and the exit status
    try:
        while step < cfg.steps and not stopping():
            # receive → gate
            groups, wait_s = intake.collect(learner_version, L.batch_groups, L.data_timeout_s, stopping)
            if len(groups) < L.batch_groups:
                break
            due = schedule.due(step, learner_version, cfg)  # the other ranks follow the same schedule
            t0 = time.perf_counter()
            batch = collate(groups, tokenizer.pad_token_id)                                      # batch
            adv = advantages.compute(batch.rewards, a.estimator, a.r_min_correct, a.std_normalize)  # advantages
            t1 = time.perf_counter()
            settled = weights.settle_s
            out, train = ranks.train_step(engine, batch, adv)                                    # step
            t2 = time.perf_counter()
            settle_s = weights.settle_s - settled  # waiting for the last publish's copy: publishing's cost
            if due.publish:                                                                      # publish
                weights.publish(learner_version + 1)
            t3 = time.perf_counter()
            timings = {"wait_s": wait_s, "batch_s": t1 - t0, "train_s": t2 - t1 - settle_s,
                       "publish_s": t3 - t2 + settle_s}
            rec = stepstats.record(step, learner_version, batch, adv, out, train, a.r_min_correct, timings,
                                   filtered=[g.filtered for g in groups])
            if due.weight_stats:
                rec.update(engine.weight_stats())
            t4 = time.perf_counter()
            telemetry.observe_step(rec, stepstats.distributions(learner_version, batch, out))    # observe
            telemetry.observe_accounting(accounting := intake.accounting())
            rec["metrics_s"] = time.perf_counter() - t4
            if due.evaluate:                                                                     # evaluate
                rec.update(evaluator().run(engine.full_state_dict()))
            learner_version, step = learner_version + 1, step + 1
            health.beat(step=step, learner_version=learner_version)
            runlog.step({**rec, **accounting, "elapsed_s": time.time() - started})
            if cfg.strict:
                stepstats.check_strict(rec, stepstats.ratio_tolerance(L.strict_ratio_tol, cfg.model.dtype))
            if due.checkpoint:
                checkpoint()
            if L.slow_step_s:
                time.sleep(L.slow_step_s)
    except BaseException as e:
        error = e
        raise
    finally:
        weights.shutdown()
        intake.drain(L.shutdown_drain_s)
        # A full disk keeps the newest complete checkpoint as the last one: another save would only fail.
        save = (step != saved_at or not (runlog.checkpoints / checkpoints.LATEST).exists()) and \
            not storage.is_disk_full(error)
        ranks.stop(save)
        final_error = None
        if save:
            try:
                checkpoint()
            except Exception as e:  # the summary still gets written, then the run fails with this
                log.error("final checkpoint failed: %s", storage.reason(e))
                final_error, error = e, error or e
        weights.close()
        status = "failed" if error is not None else "finished" if step >= cfg.steps else "stopped"
        summary = runlog.summary(
            {"status": status, **({"error": storage.reason(error)} if error is not None else {}),
             "learner_version": learner_version, "wall_s": time.time() - started, "stopped_early": step < cfg.steps,
             **intake.accounting(), "reconciliation": intake.reconciliation(), **_metrics_cost(runlog, server),
             **weights.report()},
            reward_range=(min(reward.levels), max(reward.levels)))
        runlog.close()
        receiver.close()
        if gate:
            gate.stop()
        ctx.term()
        engine.close()
        if server:
            server.close()
    if final_error is not None:
        raise final_error
    log.info("learner done: %s", summary)
    return summary


def _open_sockets(cfg: Config, vocab_size: int):
    """The ZeroMQ context, CurveZMQ (when configured) and the socket groups come in on; the weight
    channel's sockets use the same context and keys."""
    t = cfg.transport
    ctx = zmq.Context()
    curve = security.learner_curve(t.curve_keys) if t.curve_keys else None
    gate = security.Gatekeeper(ctx, t.curve_keys) if t.curve_keys else None  # before any socket binds
    security.warn_if_exposed(t.host, curve)
    receiver = GroupReceiver(ctx, endpoint(t.host, t.group_port), t.recv_hwm, t.max_message_bytes, vocab_size, curve)
    return ctx, curve, gate, receiver


def _monitoring(cfg: Config, reward_levels: list[float]
                ) -> tuple[prometheus_metrics.LearnerMetrics, exporter.Health, exporter.Exporter | None]:
    registry = prometheus_metrics.new_registry()
    settings = {"on_policy": cfg.on_policy, "max_staleness": str(cfg.max_staleness), "task": cfg.task.name,
                "model": cfg.model.path or "tiny", "group_size": str(cfg.actors.group_size),
                "batch_groups": str(cfg.learner.batch_groups), "r_min_correct": str(cfg.advantage.r_min_correct)}
    telemetry = prometheus_metrics.LearnerMetrics(registry, cfg.name, cfg.advantage.estimator, reward_levels,
                                       cfg.max_staleness, settings)
    health = exporter.Health("learner", cfg.monitoring.healthy_within_s)
    return telemetry, health, exporter.serve(registry, health, cfg.monitoring.host, cfg.monitoring.learner_port)


def _metrics_cost(runlog: RunLog, server: exporter.Exporter | None) -> dict:
    """Time spent updating metrics plus CPU time spent rendering scrapes, as a share of step time."""
    scrape_s = server.scrape_cpu_s if server else 0.0
    return {"metrics_s": runlog.metrics_s, "metrics_scrape_cpu_s": scrape_s,
            "metrics_scrapes": server.scrapes if server else 0,
            "metrics_overhead_fraction": (runlog.metrics_s + scrape_s) / runlog.step_s if runlog.step_s else None}
