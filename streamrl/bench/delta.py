"""`streamrl bench delta`: delta weight versions (transport.weights_delta) on real training steps at a paper
learning rate, against full versions of the same weights.

The model is the release folder's shape (`streamrl.models.release_model`: Qwen3, 151,936 vocabulary, ~10 M
parameters, nearly all embedding and output layer). The learner's own engine (`learner.engine.Engine`, DeepSpeed)
takes real optimizer steps at lr 1e-6 on random batches; on CPU it trains in fp32 (bf16 training there is
DeepSpeed-unsupported and far slower), and each version is published as its bf16 cast, what a bf16 learner's
actors receive (its fp32 master weights rounded), and as the fp32 weights themselves.

Reported per dtype: the fraction of elements whose bits changed per version, bytes per version full and as a delta
(`streamrl.comm.weights.encoders.DeltaEncoder`, what the learner sends), their ratio; and for bf16 the time per
version from publish to a subscriber process holding the assembled version (a WeightPublisher → WeightSubscriber over
TCP), delta against full, on loopback, or across a network-namespace link when `STREAMRL_BENCH_NETNS="PUB_NS SUB_NS
SUB_HOST_ADDR"` names one (`.ci/netns_cluster.sh` makes them; its links are shaped to 1 Gbit/s).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import torch
from safetensors.torch import load_file, save_file

LR = 1e-6


def _versions(n: int, seed: int = 0) -> list[dict]:
    """The fp32 weights after 0..n optimizer steps of the learner's engine at lr 1e-6 (host copies), trained in a
    spawned process of its own: the engine initialises torch.distributed and DeepSpeed, whose module-level group
    caches (`deepspeed.utils.groups`) outlive a destroyed process group, so an engine made after another one in the
    same process (`streamrl bench --short` runs every bench in one) fails in `deepspeed.initialize`."""
    import multiprocessing as mp
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        # Files, not the pool's pipe (its tensors would be shared memory whose sender has left), and safetensors,
        # not torch.save: nothing in streamrl unpickles (tests/unit/core/test_no_pickle.py).
        with mp.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
            pool.apply(_train_versions, (n, seed, torch.get_num_threads(), tmp))
        return [load_file(os.path.join(tmp, f"v{v}.safetensors")) for v in range(n + 1)]


def _train_versions(n: int, seed: int, threads: int, folder: str) -> None:
    """(In its own process) `_versions`, each saved as `folder`/v<version>.safetensors."""
    from streamrl import config
    from streamrl.bench.learner import _batch, _model
    from streamrl.learner.engine import Engine

    cfg = config.load(None, ["learner.batch_groups=2", "actors.group_size=8", "learner.micro_batch_tokens=512",
                             f"optim.lr={LR}", "optim.warmup_steps=0"])
    torch.set_num_threads(threads)
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(k, None)  # an earlier engine in the parent set them: its port may still be held there
    model = _model(seed)
    engine = Engine(cfg, model)
    try:
        out = [{k: t.detach().clone() for k, t in engine.published_state().items()}]
        for step in range(n):
            batch = _batch(2, 8, (16, 32), (8, 48), model.config.vocab_size, seed=seed + 1 + step)
            adv = torch.randn(2, 8, generator=torch.Generator().manual_seed(seed + 100 + step))
            engine.train_step(batch, adv)
            out.append({k: t.detach().clone() for k, t in engine.published_state().items()})
    finally:
        engine.close()
    for v, state in enumerate(out):
        save_file({k: t.contiguous() for k, t in state.items()}, os.path.join(folder, f"v{v}.safetensors"))


def _changed(a: dict, b: dict) -> float:
    """Fraction of elements whose bits differ between two versions."""
    n = changed = 0
    for k, t in a.items():
        ints = {2: torch.int16, 4: torch.int32}[t.element_size()]
        changed += int((t.view(ints) != b[k].view(ints)).sum())
        n += t.numel()
    return changed / n


def _sizes(states: list[dict]) -> dict:
    from streamrl.comm.weights import chunks, encoders

    layout = chunks.Layout(states[0])
    enc = encoders.DeltaEncoder("on", full_every=1 << 30)
    for v, s in enumerate(states):
        enc.encode(v, layout, list(s.values()), chunks.DEFAULT_CHUNK_BYTES, "bench")
    r = enc.report()
    return {"full_bytes": layout.total, "delta_bytes": r["weights_delta_bytes_per_version"],
            "encode_ms": 1e3 * enc.encode_s / len(states)}


def _subscriber(pub_addr: str, req_addr: str, ack_addr: str, n: int) -> None:
    """(In its own process, maybe in another namespace) take versions 0..n and ack each complete one."""
    import zmq

    from streamrl.comm.control import Inbox
    from streamrl.comm.weights.subscriber import WeightSubscriber

    ctx = zmq.Context()
    ack = ctx.socket(zmq.PUSH)
    ack.connect(ack_addr)
    inbox = Inbox(ctx, req_addr, "bench", 1 << 30)
    sub = WeightSubscriber(ctx, pub_addr, inbox, 1 << 30, keep_base=True)
    got = sub.wait_for(0, 120, ask_first=True)
    ack.send(str(got[0]).encode())
    while got[0] < n:
        got = sub.wait_for(got[0] + 1, 120)
        ack.send(str(got[0]).encode())
    ack.send(f"done {sub.deltas} {sub.fulls} {dict(sub.rejected.counts)}".encode())
    for s in (ack, inbox.sock, sub.sub):
        s.close(linger=1000)
    ctx.term()


def _transfer(states: list[dict], mode: str) -> list[float]:
    """Seconds from publish to the subscriber's ack, versions 1..n (version 0, full, joins it)."""
    import zmq

    from streamrl.bench.groups import free_port
    from streamrl.comm.control import ControlServer
    from streamrl.comm.weights.publisher import WeightPublisher

    ns = os.environ.get("STREAMRL_BENCH_NETNS", "").split()
    pub_host, sub_prefix = ("0.0.0.0", ["ip", "netns", "exec", ns[1]]) if ns else ("127.0.0.1", [])
    learner_addr = ns[2] if ns else "127.0.0.1"
    ports = [free_port() for _ in range(3)]
    ctx = zmq.Context()
    pub = WeightPublisher(ctx, f"tcp://{pub_host}:{ports[0]}", 1 << 30, delta_mode=mode, full_every=1 << 30)
    control = ControlServer(ctx, f"tcp://{pub_host}:{ports[1]}", pub)
    acks = ctx.socket(zmq.PULL)
    acks.bind(f"tcp://{pub_host}:{ports[2]}")
    n = len(states) - 1
    code = f"from streamrl.bench.delta import _subscriber; _subscriber(*{[f'tcp://{learner_addr}:{p}' for p in ports]!r}, {n})"
    proc = subprocess.Popen([*sub_prefix, sys.executable, "-c", code])
    times = []
    try:
        for v, state in enumerate(states):
            t0 = time.perf_counter()
            pub.publish(v, state, wait=False)
            deadline = t0 + 300
            while not acks.poll(5):
                control.serve()
                assert time.perf_counter() < deadline and proc.poll() is None, "the subscriber never acked"
            assert int(acks.recv()) == v
            if v:
                times.append(time.perf_counter() - t0)
            pub.settle()
        assert acks.poll(60_000)
        _, deltas, fulls, rejected = acks.recv().decode().split(" ", 3)
        assert rejected == "{}" and int(deltas) == (n if mode == "on" else 0), (deltas, fulls, rejected)
    finally:
        proc.wait(60) if proc.poll() is None else None
        pub.close()
        control.close()
        acks.close(0)
        ctx.term()
    return times


def delta(short: bool = False) -> list[dict]:
    n = 3 if short else 10
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    fp32 = _versions(n)
    bf16 = [{k: t.to(torch.bfloat16) for k, t in s.items()} for s in fp32]
    rows = []
    for dtype, states in (("bfloat16", bf16), ("float32", fp32)):
        frac = [_changed(a, b) for a, b in zip(states, states[1:])]
        sizes = _sizes(states)
        rows.append({"bench": "delta_sizes", "dtype": dtype, "lr": LR, "versions": n,
                     "changed_median": statistics.median(frac), "changed_max": max(frac), **sizes,
                     "bytes_ratio": sizes["full_bytes"] / sizes["delta_bytes"]})
    full, dlt = _transfer(bf16, "off"), _transfer(bf16, "on")
    link = "netns" if os.environ.get("STREAMRL_BENCH_NETNS") else "loopback"
    rows.append({"bench": "delta_transfer", "dtype": "bfloat16", "link": link, "versions": n,
                 "full_ms": 1e3 * statistics.median(full), "delta_ms": 1e3 * statistics.median(dlt),
                 "speedup": statistics.median(full) / statistics.median(dlt)})
    return rows
