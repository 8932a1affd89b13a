"""The learner process: receive → gate → batch → advantages → DeepSpeed step → publish."""

from __future__ import annotations

import logging
import time

import torch

from streamrl.algo import advantages
from streamrl.config import Config
from streamrl.learner import checkpoints, follower, schedule, stepstats
from streamrl.learner.evals import Evals
from streamrl.learner.batch import collate
from streamrl.learner.engine import Engine
from streamrl.learner.ranks import Ranks
from streamrl.learner.session import Position, Session
from streamrl.models import model as model_lib
from streamrl.run.lifecycle import stop_on_signals
from streamrl.tasks import rewards
from streamrl.telemetry.startup import Phases

log = logging.getLogger("streamrl.learner")


def run(cfg: Config, phases: Phases | None = None) -> dict:
    """phases: the start-up marks (`streamrl learner` passes its own; they start at the spawn)."""
    phases = phases or Phases("learner")
    stop = stop_on_signals()
    if cfg.learner.threads:
        torch.set_num_threads(cfg.learner.threads)
    torch.manual_seed(cfg.seed)
    reward = rewards.build(cfg)
    model, tokenizer = model_lib.build(cfg, reward.task.vocabulary)
    vocab_size = model_lib.vocab_size(model)  # before ZeRO-3 partitions the embedding away
    phases.mark("model")
    engine = Engine(cfg, model)
    phases.mark("engine")
    ranks = Ranks.current()
    ckpt_dir = cfg.run_path / "checkpoints"
    resumed = checkpoints.resume(engine, ckpt_dir) if cfg.learner.resume else None  # a filesystem all ranks share
    step, version = (resumed[1]["step"], resumed[1]["version"]) if resumed else (0, 0)
    if not ranks.leader:  # ranks > 0 train on their share of each batch and never touch a socket
        return follower.run(cfg, engine, ranks, str(ckpt_dir), step, version)
    at = Position(step, version, saved_at=step)
    s = Session(cfg, engine, ranks, vocab_size, reward.levels, at)
    L, a = cfg.learner, cfg.advantage
    evals = Evals(cfg, reward.task, s.control, s.receiver, s.telemetry, s.intake.dropped, wait=s.poll)  # on the actors

    def stopping() -> bool:  # the intake asks every 100 ms while it waits: proof of life for /healthz
        s.health.beat()
        return stop()

    s.weights.publish(at.version)
    phases.mark("ready")
    s.health.beat(step=at.step, learner_version=at.version)
    log.info("learner ready at version %d, step %d, training on %s (%d rank%s); waiting for actors on %s",
             at.version, at.step, engine.device, ranks.world, "s" if ranks.world > 1 else "", cfg.transport.group_port)
    error: BaseException | None = None  # what ended the run early, for summary.json and the exit status
    try:
        while at.step < cfg.steps and not stopping():
            groups, wait_s = s.intake.collect(at.version, L.batch_groups, L.data_timeout_s, stopping)  # receive, gate
            if len(groups) < L.batch_groups:
                break
            phases.mark("first_group")
            due = schedule.due(at.step, at.version, cfg)  # the other ranks follow the same schedule
            t0 = time.perf_counter()
            batch = collate(groups, tokenizer.pad_token_id)                                      # batch
            adv = advantages.compute(batch.rewards, a.estimator, a.r_min_correct, a.std_normalize)  # advantages
            t1 = time.perf_counter()
            settled = s.weights.settle_s
            out, train = ranks.train_step(engine, batch, adv)                                    # step
            t2 = time.perf_counter()
            settle_s = s.weights.settle_s - settled  # waiting for the last publish's copy: publishing's cost
            if due.publish:                                                                      # publish
                s.weights.publish(at.version + 1)
            t3 = time.perf_counter()
            timings = {"wait_s": wait_s, "batch_s": t1 - t0, "train_s": t2 - t1 - settle_s,
                       "publish_s": t3 - t2 + settle_s}
            rec = stepstats.record(at.step, at.version, batch, adv, out, train, a.r_min_correct, timings,
                                   filtered=[g.filtered for g in groups])
            if due.weight_stats:
                rec.update(engine.weight_stats())
            t4 = time.perf_counter()
            s.telemetry.observe_step(rec, stepstats.distributions(at.version, batch, out))       # observe
            s.telemetry.observe_accounting(accounting := s.intake.accounting())
            rec["metrics_s"] = time.perf_counter() - t4
            if due.evaluate:                                                                     # evaluate
                evals.request(at.step, at.version + 1)
            rec.update(evals.take(wait=at.step + 1 == cfg.steps, stop=stopping))  # one that came back
            at.advance()
            s.health.beat(step=at.step, learner_version=at.version)
            s.runlog.step({**rec, **accounting, "elapsed_s": time.time() - s.started})
            if not phases.written:
                phases.mark("first_step")
                phases.done(cfg.run_path, log)
            if cfg.strict:
                stepstats.check_strict(rec, stepstats.ratio_tolerance(L.strict_ratio_tol, cfg.model.dtype))
            if due.checkpoint:
                s.checkpoint()
            if L.slow_step_s:
                time.sleep(L.slow_step_s)
    except BaseException as e:
        error = e
        raise
    finally:
        summary, final_error = s.close(error)
    if final_error is not None:
        raise final_error
    log.info("learner done: %s", summary)
    return summary
