"""The `transport` section: sockets between actors and learner, and weight sync."""

from __future__ import annotations

from typing import Literal

from streamrl.config.base import PositiveInt, NonNegInt, Port, PositiveFloat, _Section


class TransportConfig(_Section):
    host: str = "127.0.0.1"
    """Address the learner binds and actors connect to."""
    group_port: Port = 29610
    """Learner PULL port for scored groups; 0: any free port (`streamrl run` tells actors; a lone learner logs it)."""
    weights_port: Port = 29611
    """Learner PUB port for weight broadcasts; 0: any free port (as group_port)."""
    weights_request_port: Port = 29612
    """Learner ROUTER port where a (late) actor asks for the newest weights; 0: any free port (as group_port)."""
    send_hwm: PositiveInt = 4
    """Actor-side queue bound in messages, each one group or a batch of small ones (backpressure, not memory growth)."""
    recv_hwm: PositiveInt = 4
    """Learner-side queue bound in messages."""
    batch_max_bytes: NonNegInt = 64 * 1024
    """Groups of one generate call share a message up to this many bytes of arrays; larger ones go alone; 0: never."""
    curve_keys: str | None = None
    """Folder made by `streamrl keys`: CurveZMQ encryption, and the learner admits only keys in its authorized/."""
    max_message_bytes: PositiveInt = 256 * 1024 * 1024
    """Largest message a socket accepts; bigger ones are dropped by ZeroMQ."""
    weight_sync: Literal["zmq", "collective", "ipc"] = "zmq"
    """Weights to actors: zmq, collective (NCCL broadcast, gloo on CPU) or ipc (CUDA IPC, one node); else zmq."""
    weights_delta: Literal["auto", "on", "off"] | bool = "off"
    """Weights as differences from the previous version (XOR, zstd, CRC-32 checked; full when needed): on, auto (when smaller), off."""
    weights_host_copy: Literal["auto", "on", "off"] | bool = "auto"
    """Send full versions from a host copy, so the learner may outrun the network within max_staleness: auto/on/off."""
    weights_delta_full_every: PositiveInt = 20
    """With weights_delta: every this many versions one goes full, so a lost base costs at most this many versions."""
    weight_sync_port: Port = 29613
    """Collective weight sync: the learner's rendezvous port (TCPStore); 0: any free port, under `streamrl run` only."""
    weight_sync_timeout_s: PositiveFloat = 60.0
    """Collective weight sync: timeout of every broadcast (then zmq takes over for good)."""
    weight_sync_rendezvous_s: PositiveFloat = 300.0
    """Collective weight sync: how long the group may take to form (a learner loading a large model starts late)."""
    weight_sync_bucket_bytes: PositiveInt = 256 * 1024 * 1024
    """Collective weight sync: tensors of one dtype share a broadcast up to this many bytes."""

    def __post_init__(self) -> None:
        for name in ("weights_delta", "weights_host_copy"):  # YAML reads a bare on/off as a boolean
            if isinstance(getattr(self, name), bool):
                setattr(self, name, "on" if getattr(self, name) else "off")

