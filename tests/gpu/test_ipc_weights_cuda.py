"""The CUDA IPC weight sync (streamrl.comm.weights.ipc.CudaIpc) between two processes on one GPU: a learner process
exports a bf16/fp32/int64 state, a spawned actor process decodes the manifest from its msgpack bytes, opens its
handle with torch's rebuild_cuda_tensor, copies the tensors out and acknowledges; the learner frees the buffer on
that acknowledgement. A process without CUDA falls back (ok=False, the reason named). Both run in spawned processes,
so CUDA stays uninitialised in the pytest process (tests/unit/core/test_cuda_untouched.py). Not run yet: no GPU in
the session that wrote it; the protocol's CPU counterpart is tests/unit/comm/test_ipc_weights.py."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest

pytestmark = pytest.mark.gpu


def _state(device: str, rows: int = 1000) -> dict:
    """(rows, 1024) bf16, (1024, 8) fp32 and (7,) int64 tensors, the same in every process."""
    import torch

    g = torch.Generator().manual_seed(0)
    return {"embed": torch.randn(rows, 1024, generator=g).to(torch.bfloat16).to(device),
            "head": torch.randn(1024, 8, generator=g).to(device), "steps": torch.arange(7).to(device)}


def _actor(frames: bytes, hide_cuda: bool, rows: int, out) -> None:
    if hide_cuda:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    from streamrl.comm import wire
    from streamrl.comm.weights import ipc

    msg = wire.decode_header([frames])
    acks = []
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    expected = _state("cpu", rows)
    receiver = ipc.IpcReceiver(ipc.CudaIpc(), "actor-0", expected, device, acks.append)
    got = receiver.receive(msg)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    same = got is not None and all(torch.equal(got[k].cpu(), v) for k, v in expected.items())
    out.put((same, acks[0].ok, acks[0].reason, receiver.sync_s))


def _learner(hide_cuda: bool, rows: int, out) -> None:
    """Exports version 1, has an actor process take it, acknowledges it here, and reports; then times the host
    round trip the ZeroMQ path makes at least (device to host, host to device; the sockets come on top)."""
    import torch

    from streamrl.comm import wire
    from streamrl.comm.weights import ipc

    exporter = ipc.IpcExporter(ipc.CudaIpc(), actors=1)
    assert exporter.formed()
    state = _state("cuda", rows)
    msg = exporter.announcement(1, state, "learner-a")
    torch.cuda.synchronize()
    ctx = mp.get_context("spawn")
    back = ctx.Queue()
    proc = ctx.Process(target=_actor, args=(wire.encode(msg)[0], hide_cuda, rows, back))
    proc.start()
    same, ok, reason, open_s = back.get(timeout=180)
    proc.join(60)
    exporter.ack(wire.WeightsIpcAck(actor_id="actor-0", version=1, ok=ok, reason=reason))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    copied = {k: v.cpu().to("cuda") for k, v in state.items()}
    torch.cuda.synchronize()
    host_s = time.perf_counter() - t0
    assert all(torch.equal(copied[k], v) for k, v in state.items())
    out.put({"actor_exit": proc.exitcode, "same": same, "ok": ok, "reason": reason, "open_s": open_s,
             "export_s": exporter.export_s, "held": len(exporter.live), "released": exporter.released,
             "left": dict(exporter.left), "formed_after": exporter.formed(), "host_s": host_s,
             "device": torch.cuda.get_device_name()})


def _run(hide_cuda: bool, rows: int = 1000) -> dict:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_learner, args=(hide_cuda, rows, out))
    proc.start()
    got = out.get(timeout=300)
    proc.join(60)
    assert proc.exitcode == 0 and got["actor_exit"] == 0, got
    return got


def test_an_actor_process_opens_the_learners_cuda_ipc_handle_and_gets_every_tensor_bit_exact():
    got = _run(hide_cuda=False)
    assert got["ok"] and got["same"], got["reason"]
    assert got["held"] == 0 and got["released"] == 1  # freed on the acknowledgement


def test_an_actor_process_without_cuda_reports_why_and_leaves_ipc():
    got = _run(hide_cuda=True)
    assert not got["ok"] and not got["same"] and "no CUDA device in this process" in got["reason"]
    assert "actor-0" in got["left"] and not got["formed_after"]


def test_ipc_time_for_a_256_mib_version_against_a_host_round_trip_is_printed():
    """Not a speed bound: prints the learner's export plus the actor's open-and-copy against the host round trip,
    measured in the same run."""
    got = _run(hide_cuda=False, rows=128 * 1024)  # (131072, 1024) bf16: 256 MiB
    assert got["ok"] and got["same"], got["reason"]
    ipc_s = got["export_s"] + got["open_s"]
    print(f"\nipc: export {got['export_s']:.4f}s + open and copy {got['open_s']:.4f}s = {ipc_s:.4f}s; host round "
          f"trip {got['host_s']:.4f}s; ratio host/ipc {got['host_s'] / ipc_s:.1f}x ({got['device']})")
