"""The `monitoring` section: Prometheus endpoints and experiment trackers."""

from __future__ import annotations

from typing import Any

from streamrl.config.base import NonNegFloat, Port, PositiveFloat
from streamrl.config.plugged import PluginSection
from streamrl.registry import TRACKERS


class MonitoringConfig(PluginSection):
    SELECTORS = (("report_to", TRACKERS),)
    SECTION = "monitoring"

    host: str = "127.0.0.1"
    """Address /metrics and /healthz bind to (0.0.0.0 lets a Prometheus on another host scrape)."""
    learner_port: Port = 29620
    """Learner /metrics and /healthz port; 0 turns them off (not "any free port", as 0 is for transport.* ports)."""
    actor_port: Port = 29630
    """Actor i serves /metrics and /healthz on actor_port + i; 0 turns them off (not "any free port")."""
    healthy_within_s: PositiveFloat = 600.0
    """/healthz answers 503 when the main loop has made no progress for this long."""
    actor_stall_s: NonNegFloat = 600.0
    """An actor's /healthz is 503 (stalled, with why) when one generate call runs this long (0: never)."""
    report_to: list[str] = []
    """Experiment trackers fed the learner's step records (any of tensorboard, wandb, mlflow, trackio; docs/guides/trackers.md)."""
    tracker_project: str = "streamrl"
    """Project (W&B, trackio) or experiment (MLflow) the run is filed under; WANDB_PROJECT / MLFLOW_EXPERIMENT_NAME win."""

    opts: dict[str, Any] = {}
    """The options of the trackers it names that bring their own, parsed by their Structs from the other keys."""

    def __post_init__(self) -> None:
        for name in self.report_to:
            if name not in TRACKERS:
                raise ValueError(f"report_to={self.report_to!r}: {TRACKERS.unknown(name)}")
        if len(set(self.report_to)) != len(self.report_to):
            raise ValueError(f"report_to={self.report_to!r}: names a tracker twice")
        super().__post_init__()

