"""Learner rank 0's weight channel: the engine's weights out to the actors.

One object owns everything weights on the learner side: the ZeroMQ publisher (broadcasts, and
re-broadcasts for actors that ask on the control channel), the collective group's end when
`transport.weight_sync: collective` (a version that fails there goes over ZeroMQ, and the
collective is left for good) or the CUDA IPC exporter when `ipc` (the same face), settling a background
copy before the optimizer changes the parameters it reads, and the publish metrics. The learner's loop sees
`publish`, `settle`, `flush`, `close` and `report`.
"""

from __future__ import annotations

import time

import zmq

from streamrl.comm.security import Curve
from streamrl.comm.sockets import endpoint
from streamrl.comm.weights.ipc import CudaIpc, IpcExporter
from streamrl.comm.weights.publisher import WeightPublisher
from streamrl.comm.wire import WeightsCollective
from streamrl.config import Config
from streamrl.learner.engine import Engine
from streamrl.telemetry import prometheus_metrics


class LearnerWeights:
    def __init__(self, cfg: Config, ctx: zmq.Context, curve: Curve | None, engine: Engine,
                 telemetry: prometheus_metrics.LearnerMetrics):
        t = cfg.transport
        self.engine, self.telemetry = engine, telemetry
        self.publisher = WeightPublisher(ctx, endpoint(t.host, t.weights_port), t.max_message_bytes, curve,
                                         delta_mode=t.weights_delta, full_every=t.weights_delta_full_every,
                                         host_copy=host_copy_run_ahead(cfg, engine.device.type != "cpu"))
        """The ZeroMQ end; the control channel's requests are answered through it."""
        self.sync = _sync(cfg)
        self.acks = self.sync.ack if isinstance(self.sync, IpcExporter) else None
        """For the control channel: actors' acknowledgements of IPC versions (None unless weight_sync=ipc)."""
        # A publish copies and sends in the background during the next forward/backward: the
        # optimizer step waits for that copy before it changes the parameters the copy reads.
        engine.before_step = self.publisher.settle
        self.last_bytes = 0
        """Bytes of the last version published (the adapters only, with LoRA)."""
        self._counted = {"full": 0, "delta": 0}  # publisher.sent as far as Prometheus has it

    def publish(self, version: int) -> None:
        """Send the engine's weights as `version`: over the collective once its group has formed
        (announced on the ZeroMQ channel first), else, or when that fails, over ZeroMQ. Returns
        before the ZeroMQ copy and send are done (see `settle`); the collective branch reads the
        weights here, synchronously."""
        t0 = time.perf_counter()
        state = self.engine.published_state()  # the adapters only, with LoRA
        collective = self.sync is not None and self.sync.formed()
        nbytes = self.publisher.publish(version, state, broadcast=not collective, wait=False)
        sent = {"full": 0, "delta": 0}
        if collective:
            msg = self.sync.announcement(version, state, self.publisher.session)  # None: IPC could not export it
            if msg is not None:
                self.publisher.announce(msg)
            if msg is not None and self.sync.send(version, state):
                sent["full"] = nbytes if isinstance(msg, WeightsCollective) else 0  # IPC puts no bytes on a wire
            else:
                self.publisher.publish(version, state, wait=False)
        self.telemetry.observe_publish(time.perf_counter() - t0, self._sent_since(sent))
        self.last_bytes = nbytes

    def _sent_since(self, sent: dict[str, int]) -> dict[str, int]:
        """`sent` plus the bytes the ZeroMQ publisher put out since the last call, by kind. A background publish is
        counted once its messages are made: the version just started shows at the next publish (or `close`)."""
        now = dict(self.publisher.sent)
        for kind, total in now.items():
            sent[kind] = sent.get(kind, 0) + total - self._counted[kind]
        self._counted = now
        return sent

    def settle(self) -> None:
        """Wait until the last publish has copied the weights (before anything changes or saves them)."""
        self.publisher.settle()

    def flush(self) -> None:
        """Wait until the last publish is copied and sent, leaving it the answer to weight requests
        (before a checkpoint: saving changes no parameter, so there is no need to `settle`)."""
        self.publisher.flush()

    @property
    def settle_s(self) -> float:
        """Seconds the learner has spent waiting in `settle` (the optimizer step's included): publishing's cost."""
        return self.publisher.settle_s

    def close(self) -> None:
        if self.sync:
            self.sync.close()
        self.publisher.close()
        self.telemetry.observe_publish(None, self._sent_since({}))

    def report(self) -> dict:
        """For the run's summary: bytes of the last version (full); with weights_delta the versions and bytes per
        version sent full and as deltas, with a host copy the seconds it took; the versions skipped (the one before
        still on its way); the longest the learner waited for a publish's copy, and the collective's record (versions
        over it, their time, why it was left)."""
        return {"publish_bytes_per_version": self.last_bytes, **self.publisher.report(),
                "weights_settle_max_s": self.publisher.settle_max_s,
                **({"weight_sync": self.sync.report()} if self.sync else {})}


def host_copy_run_ahead(cfg: Config, on_gpu: bool) -> int | None:
    """How many versions a host copy of the weights may skip behind a send still going on (None: no host copy; the
    versions are sent from the parameters and the learner waits for each).

    Sent from the parameters, a version holds the learner until it has crossed the network (0.93 s a version at 0.75B
    on one H200, 8x the optimizer step). Copied first, the learner goes on and skips the versions it makes meanwhile;
    but a skipped version is one the actors never hold: skipping R versions behind each send lets groups reach the
    learner 2R + 2 versions old (plus those made while a group was generated), so R = (max_staleness - 2) // 2. "auto"
    makes the copy only where weights must be copied to be sent anyway (a GPU) and it may skip at least one version:
    at R = 0 the learner still makes one version per transfer, and the copy buys nothing."""
    run_ahead = max(0, (cfg.max_staleness - 2) // 2)
    mode = cfg.transport.weights_host_copy
    return run_ahead if mode == "on" or (mode == "auto" and on_gpu and run_ahead > 0) else None


def _sync(cfg: Config):
    """The learner end of the other way weights go: the collective group (forming in the background), the CUDA IPC
    exporter, or None for zmq."""
    t = cfg.transport
    if t.weight_sync == "ipc":
        return IpcExporter(CudaIpc(), cfg.actors.num)
    if t.weight_sync != "collective":
        return None
    from streamrl.comm.weights.collective import LearnerSync
    from streamrl.comm.weights.named_group import ENGINE_GROUP
    from streamrl.registry import BACKENDS

    # Its first publish waits for the group, but never so long that an actor waiting for weights gives up.
    first_wait_s = min(t.weight_sync_rendezvous_s, cfg.actors.weights_timeout_s / 2)
    # one rank per actor, or per engine worker where the engine's workers receive (vLLM: each tensor-parallel rank)
    receivers = cfg.actors.num * cfg.actors.engine_gpus()
    # SGLang's workers form and take the group only in SGLang's own way (named_group)
    named = ENGINE_GROUP if BACKENDS.can(cfg.actors.backend, "collective_named_group") else None
    return LearnerSync(t.host, t.weight_sync_port, receivers, t.weight_sync_timeout_s, t.weight_sync_rendezvous_s,
                       t.weight_sync_bucket_bytes, first_wait_s, named)
