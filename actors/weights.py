"""An actor's weight channel: the learner's newest weights into the backend.

One object owns everything weights on the actor side: the ZeroMQ subscriber (broadcasts; it asks
for the newest weights through the actor's control `Inbox`), the collective group's end when
`transport.weight_sync: collective` (the actor's, or its engine workers' where they receive themselves: vLLM) or
the CUDA IPC receiver when `ipc` (the engine's, through the backend, where it loads them itself; an announced version
that fails there is asked for over ZeroMQ instead, inside the subscriber), loading a version into the backend,
noticing a restarted learner, and in-flight updates between decoding steps. The actor's loop calls `first`,
`update` and `wait_newer`, hands `in_flight` to the backend, and reads `version` and `life`; the learner's notices
(shutdown, demand, eval requests) are the inbox's.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import torch
import zmq

from streamrl.comm import wire
from streamrl.comm.control import Inbox
from streamrl.comm.security import Curve
from streamrl.comm.sockets import endpoint
from streamrl.comm.weights.subscriber import WeightSubscriber
from streamrl.config import Config
from streamrl.models import lora
from streamrl.registry import BACKENDS
from streamrl.telemetry import actor_metrics, exporter

log = logging.getLogger("streamrl.actor")


class ActorWeights:
    def __init__(self, cfg: Config, ctx: zmq.Context, host: str, index: int, curve: Curve | None, backend,
                 model: torch.nn.Module, telemetry: actor_metrics.ActorMetrics, health: exporter.Health,
                 inbox: Inbox):
        """model: the actor's own copy of the policy (the names, dtypes and shapes a collective must match)."""
        t = cfg.transport
        self.actor_id = f"actor-{index}"
        self.backend, self.telemetry, self.health = backend, telemetry, health
        self.timeout_s = cfg.actors.weights_timeout_s
        self.subscriber = WeightSubscriber(ctx, endpoint(host, t.weights_port), inbox, t.max_message_bytes, curve,
                                           keep_base=t.weights_delta != "off")
        if every := cfg.eval.every:  # versions due for evaluation stay at hand until the next one (see `hold`)
            self.subscriber.keep = lambda version: version % every == 0
        self.sync = None
        if t.weight_sync == "collective" and BACKENDS.can(cfg.actors.backend, "collective_in_engine"):
            from streamrl.comm.weights.engine_sync import EngineSync

            # The engine's workers join (blocking until the group forms) and load each version themselves.
            self.sync = EngineSync(
                lambda first, world: backend.join_weight_sync(host, t.weight_sync_port, first, world,
                                                              t.weight_sync_timeout_s, t.weight_sync_rendezvous_s),
                backend.receive_weight_sync, index, cfg.actors.num, cfg.actors.engine_gpus(),
                lora.published(model.state_dict()))
            self.subscriber.sync = self.sync.receive
        elif t.weight_sync == "collective":  # joins the learner's group in the background; zmq until it has formed
            from streamrl.comm.weights.collective import ActorSync

            # Subscribed first: the learner announces its first collective version as soon as the group forms.
            self.sync = ActorSync(host, t.weight_sync_port, index, cfg.actors.num, t.weight_sync_timeout_s,
                                  t.weight_sync_rendezvous_s, lora.published(model.state_dict()))
            self.subscriber.sync = self.sync.receive
        elif t.weight_sync == "ipc":
            self.sync = _ipc(self.actor_id, model, inbox, backend, BACKENDS.can(cfg.actors.backend, "ipc_in_engine"))
            self.subscriber.sync = self.sync.receive if self.sync else None
        self.version = 0
        """The policy version the backend holds (0 before any weights)."""
        self.life = 0
        """Learner restarts behind the weights held: versions of different lives are not comparable."""
        self.in_flight: Callable[[], int] | None = self._between_steps if cfg.actors.inflight_updates else None
        """For Backend.generate: loads newer weights between decoding steps, returns the version held."""
        self._held: tuple[int, dict] | None = None  # a restarted learner's weights seen mid-generation
        self.applied = self.inflight_loads = 0
        self.wait_s = 0.0

    def first(self, stop: Callable[[], bool]) -> bool:
        """Wait for the learner's current weights (asking for them at once) and load them; False if
        the run stopped first. Never generate before this."""
        got = self._wait(0, stop, ask_first=True)
        if got is not None:
            self._apply(got)
            log.info("%s: starting at policy version %d", self.actor_id, self.version)
        return got is not None

    def update(self) -> None:
        """Load the newest weights that arrived, if newer than those held (or from a restarted learner)."""
        newer, self._held = self._held or self.subscriber.poll(0), None
        if newer is not None and (newer[0] > self.version or self.subscriber.learner_restarts != self.life):
            self._apply(newer)

    def wait_newer(self, stop: Callable[[], bool]) -> bool:
        """Wait for a version newer than the one held and load it. False without one: the run stopped,
        the learner shut down, it asked for more groups at this version (`Inbox.take_demand`) or for an evaluation."""
        got = self._wait(self.version + 1, stop)
        if got is not None:
            self._apply(got)
        return got is not None

    def hold(self, version: int, stop: Callable[[], bool]) -> bool:
        """Load exactly `version` for an evaluation: the one held, the one kept aside as it arrived (an actor that
        moved past it goes back; the groups it makes next carry that version), or the next to come. False when it
        is gone (an older version than the one kept) or the run stopped."""
        sub = self.subscriber
        if self.version == version and sub.learner_restarts == self.life:
            return True
        if self.version < version and (sub.kept is None or sub.kept[0] != version):
            got = self._wait(version, stop, evals_wake=False)
            if got is not None and got[0] > self.version:
                self._apply(got)
        if self.version != version and sub.kept is not None and sub.kept[0] == version:
            newer = self.version > version
            self._apply(sub.kept)
            if newer:  # back to an older version: ask for the newest again, so it reloads after the evaluation
                sub.rewind(version)
        return self.version == version

    def watch(self) -> None:
        """Take in notices (a shutdown, into the inbox) and keep newer weights, without loading them (while blocked
        sending)."""
        self.subscriber.watch()

    def _between_steps(self) -> int:
        """In-flight updates: newer weights land between decoding steps (the KV cache stays)."""
        newer = self.subscriber.poll(0)
        if newer is not None and self.subscriber.learner_restarts != self.life:
            self._held = newer  # a restarted learner: `update` resyncs to it between generate calls
        elif newer is not None and newer[0] > self.version:
            self._apply(newer)
            self.inflight_loads += 1
        return self.version

    def _apply(self, got: tuple[int, dict]) -> None:
        t0 = time.perf_counter()
        self.backend.load_weights(got[1])
        self.version, self.life = got[0], self.subscriber.learner_restarts
        self.applied += 1
        self.telemetry.observe_weights(self.version, time.perf_counter() - t0)
        self.health.beat(policy_version=self.version)

    def _wait(self, min_version: int, stop: Callable[[], bool], ask_first: bool = False,
              evals_wake: bool = True) -> tuple[int, dict] | None:
        t0 = time.perf_counter()
        try:
            return self.subscriber.wait_for(min_version, self.timeout_s, ask_first=ask_first, stop=stop,
                                            evals_wake=evals_wake)
        finally:
            self.wait_s += (waited := time.perf_counter() - t0)
            self.telemetry.weights_wait.inc(waited)

    def report(self) -> dict:
        """For the actor's stats: versions loaded, time waiting, notices rejected, the collective's record."""
        return {"versions_applied": self.applied, "weights_wait_s": self.wait_s,
                **({"inflight_loads": self.inflight_loads} if self.inflight_loads else {}),
                "rejected": dict(self.subscriber.rejected.counts),
                **({"delta_versions": self.subscriber.deltas} if self.subscriber.keep_base else {}),
                **({"weight_sync": self.sync.report()} if self.sync else {})}

    def close(self) -> None:
        if self.sync:
            self.sync.close()
        self.subscriber.close()


def _ipc(actor_id: str, model: torch.nn.Module, inbox: Inbox, backend, engine: bool):
    """The CUDA IPC receiver, or None (one log line) where this process has no CUDA. engine: the backend's engine
    opens and loads each version itself (`receive_weight_ipc`), so the actor's own model may stay off the GPU."""
    from streamrl.comm.weights.ipc import CudaIpc, IpcReceiver

    device = next(model.parameters()).device
    expected = lora.published(model.state_dict())
    if engine:
        return IpcReceiver(CudaIpc(), actor_id, expected, device, inbox.ack, into=backend.receive_weight_ipc)
    if device.type != "cuda":
        why = f"the model is on {device}, not a CUDA device"
        log.error("weight sync ipc: %s: %s; weights go over ZeroMQ", actor_id, why)
        inbox.ack(wire.WeightsIpcAck(actor_id=actor_id, version=-1, ok=False, reason=why))  # no handles for it
        return None
    return IpcReceiver(CudaIpc(), actor_id, expected, device, inbox.ack)
