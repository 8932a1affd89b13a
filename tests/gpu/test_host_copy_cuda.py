"""Weights on a GPU copied whole into pinned host memory before they are sent (transport.weights_host_copy, the
default for a learner on a GPU): the publisher's `settle` returns once the copy is made, before a subscriber has read
a byte; the parameters then change on the GPU, and the subscriber still gets the version as published, bit for bit.
Prints the copy's GB/s (the learner's wait per version). Runs in a spawned process, so CUDA stays uninitialised in
the pytest process. Not run yet: no GPU in the session that wrote it; its CPU counterpart is
tests/unit/comm/test_weights.py's host-memory test."""

from __future__ import annotations

import json
import multiprocessing as mp

import pytest
import torch

pytestmark = pytest.mark.gpu


def _publish(out_path: str) -> None:
    import time

    import zmq

    from streamrl.comm.weights import assembly, chunks, encoders
    from streamrl.comm.weights.publisher import WeightPublisher

    g = torch.Generator().manual_seed(0)
    live = {"embed": torch.randn(32768, 1024, generator=g).to(torch.bfloat16).cuda(),  # 64 MB
            "head": torch.randn(1024, 1000, generator=g).cuda(), "steps": torch.arange(7).cuda()}
    published = {k: t.cpu().clone() for k, t in live.items()}
    ctx = zmq.Context()
    pub = WeightPublisher(ctx, "tcp://127.0.0.1:*", max_bytes=16 << 20, host_copy=0)
    pub.pub.setsockopt(zmq.SNDBUF, 4096)
    late = ctx.socket(zmq.SUB)  # reads nothing until the parameters have changed
    late.setsockopt(zmq.RCVHWM, 1)
    late.setsockopt(zmq.RCVBUF, 4096)
    late.setsockopt(zmq.SUBSCRIBE, b"")
    late.connect(pub.pub.getsockopt_string(zmq.LAST_ENDPOINT))
    time.sleep(0.5)  # PUB/SUB joins late
    t0 = time.perf_counter()
    pub.publish(1, live, wait=False)
    pub.settle()
    settle_s = time.perf_counter() - t0
    for t in live.values():
        t.add_(1)  # the optimizer step, on the GPU
    torch.cuda.synchronize()
    messages = []
    n = -(-chunks.Layout(live).total // pub.chunk_bytes)
    while len(messages) < n and late.poll(10000):
        messages.append(late.recv_multipart())
    version, got = assembly.decode_weights(messages)
    total = chunks.Layout(live).total
    with open(out_path, "w") as f:
        json.dump({"version": version, "same": all(torch.equal(got[k], published[k]) for k in published),
                   "pinned": pub.encoder._base_t.is_pinned(), "encoder": type(pub.encoder).__name__,
                   "settle_s": settle_s, "copy_GB_per_s": total / pub.encoder.copy_s / 1e9}, f)
    late.close(0)
    pub.close()
    ctx.term()


def test_weights_on_a_gpu_are_copied_to_pinned_host_memory_and_sent_as_published_after_the_parameters_change(
        tmp_path):
    if torch.cuda.device_count() == 0:  # NVML: CUDA stays uninitialised in the pytest process
        pytest.skip("needs a GPU")
    path = tmp_path / "host_copy.json"
    p = mp.get_context("spawn").Process(target=_publish, args=(str(path),))
    p.start()
    p.join(300)
    assert p.exitcode == 0
    r = json.loads(path.read_text())
    print(r)
    assert r["encoder"] == "HostCopyEncoder" and r["pinned"]
    assert r["version"] == 1 and r["same"]
