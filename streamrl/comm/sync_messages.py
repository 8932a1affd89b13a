"""Messages of the ways weights go beside the ZeroMQ chunks: the collective group's announcement and CUDA IPC's
manifest and acknowledgement. streamrl.comm.wire re-exports them and decodes them with every other message."""

from __future__ import annotations

from msgspec import Struct

from streamrl.comm.schema import SCHEMA_VERSION


class TensorInfo(Struct, array_like=True, frozen=True):
    """One tensor of a state dict: its name, torch dtype name (e.g. "float32") and shape."""

    name: str
    dtype: str
    shape: list[int]

    @classmethod
    def of(cls, name: str, dtype, shape) -> "TensorInfo":
        """From a torch dtype and shape (torch.float32, (2, 3) -> "float32", [2, 3])."""
        return cls(name=name, dtype=str(dtype).removeprefix("torch."), shape=list(shape))


class WeightsCollective(Struct, tag="weights_collective", kw_only=True):
    """Announces that `version` follows over the collective weight-sync group (transport.weight_sync=
    collective), cut into `buckets` of one dtype each (see streamrl.comm.weights.collective): receivers join the
    broadcast when they see this, and allocate from it."""

    schema: int = SCHEMA_VERSION
    version: int
    buckets: list[list[TensorInfo]]
    sent_at: float = 0.0
    learner: str = ""


class WeightsIpc(Struct, tag="weights_ipc", kw_only=True):
    """Announces `version` as one flat byte buffer in the learner's GPU memory (transport.weight_sync=ipc; see
    streamrl.comm.weights.ipc): tensor i at byte offsets[i] of its `total` bytes. handles[k] opens it in actor k's
    process (one per actor: CUDA IPC counts each holder), empty for an actor that left IPC; `checksum` is the
    manifest's own (ipc.manifest_checksum), so a receiver refuses a damaged one before it opens anything."""

    schema: int = SCHEMA_VERSION
    version: int
    tensors: list[TensorInfo]
    offsets: list[int]
    total: int
    provider: str
    handles: list[list[int | bytes | bool]]
    sent_at: float = 0.0
    learner: str = ""
    checksum: int = 0


class WeightsIpcAck(Struct, tag="weights_ipc_ack", kw_only=True):
    """An actor copied IPC `version` out (ok), or could not open it (not ok, `reason`: it takes ZeroMQ from now on);
    the learner frees a version's buffer once every actor on IPC acknowledged it or a newer one."""

    schema: int = SCHEMA_VERSION
    actor_id: str
    version: int
    ok: bool = True
    reason: str = ""


def mismatch(msg: WeightsCollective, expected: dict[str, TensorInfo]) -> str | None:
    """Why an announced version cannot be taken by a model of `expected` tensors, or None."""
    announced = {t.name: t for b in msg.buckets for t in b}
    if announced == expected:
        return None
    return (f"version {msg.version}: the learner's tensors differ from this actor's model "
            f"({sorted(set(announced) ^ set(expected))[:3] or 'dtypes or shapes'})")
