"""What the leading learner rank opens for a run and closes at its end, in one place: the run log, the group
socket (and CurveZMQ's gate), Prometheus, the weight and control channels, the one poller that waits on them,
and the intake. Where the run is (step,
version, last checkpoint) lives in `Position`, the one object the loop advances."""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass

import zmq

from streamrl.comm import security
from streamrl.comm.control import ControlServer
from streamrl.comm.groups import GroupReceiver
from streamrl.comm.sockets import endpoint
from streamrl.config import Config, to_dict
from streamrl.learner import checkpoints, final_accounting
from streamrl.learner.engine import Engine
from streamrl.learner.intake import Intake
from streamrl.learner.pacing import Pacer
from streamrl.learner.ranks import Ranks
from streamrl.learner.runlog import RunLog
from streamrl.learner.weights import LearnerWeights
from streamrl.run import fingerprint, jsonfiles, storage
from streamrl.telemetry import exporter, prometheus_metrics, trackers

log = logging.getLogger("streamrl.learner")


@dataclass
class Position:
    """Where the run is: the next step, the version it trains, and the step of the last checkpoint."""

    step: int
    version: int
    saved_at: int
    restored: dict | None = None
    """A resumed run: its checkpoint's accounting (`Intake.state`), which the intake goes on from."""

    def advance(self) -> None:
        self.step, self.version = self.step + 1, self.version + 1


class Poller:
    """The leader's one wait on its sockets: `poll(timeout_ms)` returns once a group may wait (or the time
    passed) and serves every control request that came meanwhile, so an actor's weight request is answered
    whatever the loop waits for."""

    def __init__(self, receiver: GroupReceiver, control: ControlServer):
        self.control = control
        self.poller = zmq.Poller()
        self.poller.register(receiver.sock, zmq.POLLIN)
        self.poller.register(control.sock, zmq.POLLIN)

    def __call__(self, timeout_ms: int) -> None:
        self.poller.poll(timeout_ms)
        self.control.serve()


class Session:
    """The leader's open resources. `open` makes them; `close` ends them and writes the summary."""

    def __init__(self, cfg: Config, engine: Engine, ranks: Ranks, vocab_size: int, reward_levels: list[float],
                 at: Position):
        self.cfg, self.engine, self.ranks, self.at = cfg, engine, ranks, at
        self.reward_range = (min(reward_levels), max(reward_levels))
        self.runlog = RunLog(cfg)
        self.runlog.open(resumed_step=at.step)
        self.runlog.trackers = _trackers(cfg)
        t = cfg.transport
        self.ctx = zmq.Context()
        self.curve = security.learner_curve(t.curve_keys) if t.curve_keys else None
        self.gate = security.Gatekeeper(self.ctx, t.curve_keys) if t.curve_keys else None  # before any socket binds
        security.warn_if_exposed(t.host, self.curve)
        self.receiver = GroupReceiver(self.ctx, endpoint(t.host, t.group_port), t.recv_hwm, t.max_message_bytes,
                                      vocab_size, self.curve, self.reward_range)
        self.telemetry, self.health, self.server = _monitoring(cfg, reward_levels)
        self.weights = LearnerWeights(cfg, self.ctx, self.curve, engine, self.telemetry)  # ZeroMQ, collective or IPC
        self.control = ControlServer(self.ctx, endpoint(t.host, t.weights_request_port), self.weights.publisher,
                                     self.curve)
        self.control.acks = self.weights.acks  # weight_sync=ipc: a version's buffer is freed once acknowledged
        mine = fingerprint.of(cfg)
        self.control.admit = lambda actor, theirs: (
            None if theirs is None or not (diff := fingerprint.differences(mine, theirs)) else
            f"its settings differ from the learner's ({'; '.join(diff)})")
        gate = self.gate
        self.poll = Poller(self.receiver, self.control)
        self.intake = Intake(self.receiver, self.control, cfg.actors.group_size, cfg.max_staleness,
                             cfg.learner.demand_after_s, refused=(lambda: gate.refused) if gate else (lambda: 0),
                             strict=cfg.strict, ranks=cfg.learner.ranks, wait=self.poll)
        self.intake.pacer = Pacer(cfg, self.control)
        if at.restored is not None:  # a resumed run's accounting goes on from its checkpoint's
            self.intake.restore(at.restored)
        self.started = time.time()
        self.dealing = None  # task.epochs: the dealer of the prompts (learner.dealing.attach)

    def bound(self) -> str:
        """The ports this learner actually listens on (a configured 0 is any free port: the real one is said)."""
        def port(sock: zmq.Socket) -> str:
            return sock.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[-1]

        ports = (f"group port {port(self.receiver.sock)}, weights port {port(self.weights.publisher.pub)}, "
                 f"weights request port {port(self.control.sock)}")
        return ports + (f", metrics port {self.server.port}" if self.server else "")

    def checkpoint(self) -> None:
        # The copy is done and the parameters stay the published version (a save changes nothing),
        # so weight requests are still answered from them (settle would stop that until the next publish).
        self.weights.flush()
        state = {"step": self.at.step, "version": self.at.version, "accounting": self.intake.accounting(),
                 "intake": self.intake.state()}
        policy, extra = self.engine.full_state_dict(), None
        if self.cfg.lora.rank:  # the adapter as a PEFT folder naming its base, beside the whole policy
            from streamrl.models import lora

            state["lora"] = {"rank": self.cfg.lora.rank, "alpha": self.cfg.lora.alpha, "base": lora.base_name(self.cfg)}
            extra = functools.partial(lora.save_in_checkpoint, adapters=lora.published(policy), cfg=self.cfg)
        if self.dealing is not None:  # the data cursor beside the weights: a resume continues the epoch
            extra = functools.partial(_both, extra, self.dealing.save)
        checkpoints.save(self.runlog.checkpoints, f"step-{self.at.step}", self.engine.save, state, policy, extra)
        self.at.saved_at = self.at.step

    def close(self, error: BaseException | None) -> tuple[dict, BaseException | None]:
        """Stop the weight channel, drain the intake, stop the other ranks (with a last checkpoint when the run
        moved since the last one; else the final accounting beside that checkpoint: learner.final_accounting), write
        summary.json and close every socket. Returns the summary and the error of
        a final checkpoint that failed (the caller raises it when nothing else did)."""
        cfg, at = self.cfg, self.at
        self.control.shutdown()  # every actor is told, and a request from now on is answered with the notice
        self.intake.drain(cfg.learner.shutdown_drain_s)
        # A full disk keeps the newest complete checkpoint as the last one: another save would only fail.
        save = (at.step != at.saved_at or not (self.runlog.checkpoints / checkpoints.LATEST).exists()) and \
            not storage.is_disk_full(error)
        self.ranks.stop(save)
        final_error = None
        if save:
            try:
                self.checkpoint()
            except Exception as e:  # the summary still gets written, then the run fails with this
                log.error("final checkpoint failed: %s", storage.reason(e))
                final_error, error = e, error or e
        elif at.step == at.saved_at:  # ends at its newest checkpoint, which lacks what came since: kept beside it
            try:
                final_accounting.write(cfg.run_path, f"step-{at.step}", at.step, self.intake.state())
            except OSError as e:
                log.warning("%s not written (%s): a resume goes on from checkpoint step-%d's accounting",
                            final_accounting.FILE, storage.reason(e), at.step)
        self.weights.close()
        self.control.close()
        dealt_out = self.dealing is not None and self.dealing.dealer.finished  # the last epoch ended the run
        status = "failed" if error is not None else "finished" if at.step >= cfg.steps or dealt_out else "stopped"
        summary = self.runlog.summary(
            {"status": status, **({"error": storage.reason(error)} if error is not None else {}),
             "learner_version": at.version, "wall_s": time.time() - self.started, "stopped_early": at.step < cfg.steps,
             **self.intake.accounting(), "reconciliation": self.intake.reconciliation(), **self._metrics_cost(),
             **self.intake.failure_report(), **self.weights.report(),
             **({"epochs": self.dealing.summary()} if self.dealing is not None else {})},
            reward_range=self.reward_range)
        self.runlog.close()
        try:  # every session's detail beside the summary, which holds the first 100
            jsonfiles.write(cfg.run_path / "sessions.json", self.intake.sessions())
        except OSError as e:
            log.warning("sessions.json not written (%s); summary.json holds the first 100 sessions", storage.reason(e))
        if self.dealing is not None:
            self.dealing.close()
        self.receiver.close()
        if self.gate:
            self.gate.stop()
        self.ctx.term()
        self.engine.close()
        if self.server:
            self.server.close()
        return summary, final_error

    def _metrics_cost(self) -> dict:
        """Time spent updating metrics plus CPU time spent rendering scrapes, as a share of step time."""
        runlog, server = self.runlog, self.server
        scrape_s = server.scrape_cpu_s if server else 0.0
        return {"metrics_s": runlog.metrics_s, "metrics_scrape_cpu_s": scrape_s,
                "metrics_scrapes": server.scrapes if server else 0,
                "metrics_overhead_fraction": (runlog.metrics_s + scrape_s) / runlog.step_s if runlog.step_s else None}


def _both(first, second, folder) -> None:
    if first is not None:
        first(folder)
    second(folder)


def _trackers(cfg: Config) -> trackers.Trackers | None:
    """The experiment trackers of monitoring.report_to, opened with the run's config as hyper-parameters."""
    if not cfg.monitoring.report_to:
        return None
    run = trackers.RunInfo(name=cfg.name, path=cfg.run_path, project=cfg.monitoring.tracker_project,
                           config=to_dict(cfg))
    return trackers.Trackers(cfg.monitoring.report_to, run)


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
