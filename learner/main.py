"""The learner process: receive → gate → step (batch, advantages, DeepSpeed step, publish) → after the step."""

from __future__ import annotations

import functools
import logging
import time
from typing import Callable

import torch

from streamrl.config import Config
from streamrl.learner import checkpoints, dealing, final_accounting, follower, schedule, stepstats
from streamrl.learner.engine import Engine
from streamrl.learner.evals import Evals
from streamrl.learner.ranks import Ranks
from streamrl.learner.samples import SamplesLog
from streamrl.learner.session import Position, Session
from streamrl.learner.step import Step, train
from streamrl.models import model as model_lib
from streamrl.run import preflight
from streamrl.run.lifecycle import stop_on_signals
from streamrl.tasks import epochs, rewards
from streamrl.telemetry.startup import Phases

log = logging.getLogger("streamrl.learner")


def run(cfg: Config, phases: Phases | None = None) -> dict:
    """phases: the start-up marks (`streamrl learner` passes its own; they start at the spawn)."""
    phases = phases or Phases("learner")
    stop = stop_on_signals()
    cfg, engine, ranks, at, tokenizer, reward, vocab_size = _build(cfg, phases)
    pad_id = tokenizer.pad_token_id
    if not ranks.leader:  # ranks > 0 train on their share of each batch and never touch a socket
        return follower.run(cfg, engine, ranks, str(cfg.run_path / "checkpoints"), at.step, at.version)
    dealt = dealing.Dealing(cfg, reward.task, at.step) if cfg.task.epochs else None  # a refused resume stops here
    s = Session(cfg, engine, ranks, vocab_size, reward.levels, at)
    if dealt is not None:
        dealing.attach(s, dealt)
    evals = Evals(cfg, reward.task, s.control, s.receiver, s.telemetry, s.intake.dropped, wait=s.poll)  # on the actors
    after = AfterStep(cfg, s, evals, phases)
    samples = SamplesLog(cfg, tokenizer, cfg.run_path, at.step, s.runlog.trackers)  # what the model wrote

    def stopping() -> bool:  # the intake asks every 100 ms while it waits: proof of life for /healthz
        s.health.beat()
        return stop()

    after.ready()
    L = cfg.learner
    error: BaseException | None = None  # what ended the run early, for summary.json and the exit status
    try:
        while at.step < cfg.steps and not stopping():
            groups, wait_s = s.intake.collect(at.version, L.batch_groups, L.data_timeout_s, stopping)  # receive, gate
            if not groups or (len(groups) < L.batch_groups and not s.intake.exhausted):  # the last epoch's rest trains
                break
            phases.mark("first_group")
            samples(at.step, at.version, groups)
            due = schedule.due(at.step, at.version, cfg)  # the other ranks follow the same schedule
            publish = functools.partial(s.weights.publish, at.version + 1) if due.publish else None
            done = train(engine, groups, cfg, pad_id, step=at.step, version=at.version, ranks=ranks, wait_s=wait_s,
                         publish=publish, settled=lambda: s.weights.settle_s, weight_stats=due.weight_stats)
            if s.dealing is not None:  # each prompt trained is a ledger line; an epoch's end may call for an eval
                due = s.dealing.trained(groups, at.step, at.version, due)
            after(done, due, stopping)
    except BaseException as e:
        error = e
        raise
    finally:
        summary, final_error = s.close(error)
    if final_error is not None:
        raise final_error
    log.info("learner done: %s", summary)
    return summary


def _build(cfg: Config, phases: Phases):
    """The model, its engine (resumed from the run's last checkpoint when asked) and where the run stands:
    (config, engine, ranks, position, tokenizer, reward, vocabulary size); with task.epochs the config's steps
    follow from the rows (before the engine's learning-rate schedule reads them)."""
    if cfg.learner.threads:
        torch.set_num_threads(cfg.learner.threads)
    torch.manual_seed(cfg.seed)
    reward = rewards.build(cfg)
    if cfg.task.epochs:
        cfg = epochs.plan(cfg, len(reward.task.train))
        log.info("learner: %s", epochs.describe(cfg, len(reward.task.train)))
    model, tokenizer = model_lib.build(cfg, reward.task.vocabulary)
    vocab_size = model_lib.vocab_size(model)  # before ZeRO-3 partitions the embedding away
    phases.mark("model")
    engine = Engine(cfg, model)
    phases.mark("engine")
    ranks = Ranks.current()
    ckpt_dir = cfg.run_path / "checkpoints"
    resumed = checkpoints.resume(engine, ckpt_dir) if cfg.learner.resume else None  # a filesystem all ranks share
    if cfg.learner.resume and resumed is None and (found := preflight.results_in(cfg.run_path)):
        raise RuntimeError(f"learner.resume=true: {cfg.run_path} holds a run ({', '.join(found)}) but no complete "
                           "checkpoint; refusing to restart at step 0 over its records (--overwrite moves it aside)")
    step, version = (resumed[1]["step"], resumed[1]["version"]) if resumed else (0, 0)
    restored = final_accounting.resumed(cfg.run_path, *resumed) if resumed else None
    at = Position(step, version, saved_at=step, restored=restored)
    return cfg, engine, ranks, at, tokenizer, reward, vocab_size


class AfterStep:
    """What the leader does once a step has trained and published, in order: observe, evaluate, log the step,
    check it (strict), checkpoint."""

    def __init__(self, cfg: Config, s: Session, evals: Evals, phases: Phases):
        self.cfg, self.s, self.evals, self.phases = cfg, s, evals, phases
        self.ratio_tol = stepstats.ratio_tolerance(cfg.learner.strict_ratio_tol, cfg.model.dtype)

    def ready(self) -> None:
        """The first version out to the actors, before any group is asked for."""
        s, at = self.s, self.s.at
        s.weights.publish(at.version)
        self.phases.mark("ready")
        s.health.beat(step=at.step, learner_version=at.version)
        log.info("learner ready at version %d, step %d, training on %s (%d rank%s); waiting for actors on %s",
                 at.version, at.step, s.engine.device, s.ranks.world, "s" if s.ranks.world > 1 else "", s.bound())

    def __call__(self, done: Step, due: schedule.Due, stopping: Callable[[], bool]) -> None:
        cfg, s, at = self.cfg, self.s, self.s.at
        accounting = self.observe(done)
        s.intake.pacer.observed(at.version, done.group_kl_behaviour_learner_max)  # drift over max_drift: actors hold
        if due.evaluate:
            self.evals.request(at.step, at.version + 1)
        # a step waits for an evaluation when every step left owes one a record: none is lost to the end of the run
        came_back = self.evals.take(wait=self.evals.owed(at.step, cfg.steps) >= cfg.steps - at.step, stop=stopping,
                                    last=at.step + 1 == cfg.steps)
        at.advance()
        s.health.beat(step=at.step, learner_version=at.version)
        s.runlog.step(done, {**came_back, **accounting, "elapsed_s": time.time() - s.started})
        if not self.phases.written:
            self.phases.mark("first_step")
            self.phases.done(cfg.run_path, log)
        if cfg.strict:
            stepstats.check_strict(done, self.ratio_tol)
        if due.checkpoint:
            s.checkpoint()
        if cfg.learner.slow_step_s:
            time.sleep(cfg.learner.slow_step_s)

    def observe(self, done: Step) -> dict:
        """Hand the step to Prometheus, timed as the step's metrics_s; returns the intake's accounting."""
        t0 = time.perf_counter()
        self.s.telemetry.observe_step(done, done.tensors)
        self.s.telemetry.observe_accounting(accounting := self.s.intake.accounting())
        done.metrics_s = time.perf_counter() - t0
        return accounting
