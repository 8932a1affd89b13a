"""The CUDA IPC weight sync (streamrl.comm.weights.ipc.CudaIpc) between two processes on one GPU: the learner's
process exports a bf16/fp32 state, a spawned actor process decodes the manifest from its msgpack bytes, opens its
handle with torch's rebuild_cuda_tensor, copies the tensors out and acknowledges; the learner frees the buffer on
that acknowledgement. A process without CUDA falls back (ok=False, the reason named). Not run yet: no GPU in the
session that wrote it; the protocol's CPU counterpart is tests/unit/comm/test_ipc_weights.py."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest

pytestmark = pytest.mark.gpu


def _state(device: str) -> dict:
    import torch

    g = torch.Generator().manual_seed(0)
    return {"embed": torch.randn(1000, 64, generator=g).to(torch.bfloat16).to(device),
            "head": torch.randn(64, 8, generator=g).to(device), "steps": torch.arange(7).to(device)}


def _actor(frames: bytes, hide_cuda: bool, out) -> None:
    if hide_cuda:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    from streamrl.comm import wire
    from streamrl.comm.weights import ipc

    msg = wire.decode_header([frames])
    acks = []
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    receiver = ipc.IpcReceiver(ipc.CudaIpc(), "actor-0", _state("cpu"), device, acks.append)
    got = receiver.receive(msg)
    same = got is not None and all(torch.equal(got[k].cpu(), v) for k, v in _state("cpu").items())
    out.put((same, acks[0].ok, acks[0].reason))


def _run(hide_cuda: bool):
    import torch

    from streamrl.comm import wire
    from streamrl.comm.weights import ipc

    exporter = ipc.IpcExporter(ipc.CudaIpc(), actors=1)
    assert exporter.formed()
    msg = exporter.announcement(1, _state("cuda"), "learner-a")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_actor, args=(wire.encode(msg)[0], hide_cuda, out))
    proc.start()
    same, ok, reason = out.get(timeout=180)
    proc.join(60)
    exporter.ack(wire.WeightsIpcAck(actor_id="actor-0", version=1, ok=ok, reason=reason))
    torch.cuda.synchronize()
    return exporter, proc, same, ok, reason


def test_an_actor_process_opens_the_learners_cuda_ipc_handle_and_gets_every_tensor_bit_exact():
    exporter, proc, same, ok, reason = _run(hide_cuda=False)
    assert proc.exitcode == 0 and ok and same, reason
    assert exporter.live == {} and exporter.released == 1  # freed on the acknowledgement


def test_an_actor_process_without_cuda_reports_why_and_leaves_ipc():
    exporter, proc, same, ok, reason = _run(hide_cuda=True)
    assert proc.exitcode == 0 and not ok and not same
    assert "no CUDA device in this process" in reason and "actor-0" in exporter.left and not exporter.formed()
