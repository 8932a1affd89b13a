"""`streamrl bench`: hot-path benchmarks, each reported as a ratio against a reference measured in
the same run (never a bare time).

- transport: ScoredGroup encode → PUSH → PULL → decode + validate, process to process over
  loopback TCP, against raw ZeroMQ moving the same bytes (one frame per message, no codec); and
  groups whose every 4th token is an environment token (a model-token mask) against the same groups
  without one.
- weights: WeightPublisher → 2 WeightSubscriber processes, a version in chunks (2 GB in the full run), against
  raw PUB/SUB of the same bytes in the same chunks; and the learner's blocked share of the transfer.
- overlap: the tiny job strict vs async, against the ideal overlap bound from the strict run's timings.
- advantages: `advantages.compute(..., "corpo")` against the bare tensor expression it wraps.
- batching: the learner's collate (16 groups → padded tensors) against copying the same bytes.
- startup: `streamrl run` to the first learner step, by phase, against fresh-interpreter children
  and bare imports (`bench_startup`).
- generate: the hf actor's lean sampling loop against transformers' `generate` (bench_generate.py).
- episodes: multi-turn episodes with a tool that sleeps 50 ms against single-turn sampling of the same tokens
  (bench_episodes.py).
- learner: the learner's step at release shape (151,936 vocabulary) against plain torch (bench_learner.py).
- trl (optional, only when named; needs TRL): wall time to the same mean reward as TRL's GRPOTrainer.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import socket
import threading
import time  # numpy is imported inside the benches: the CLI reads BENCHES for its choices without it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _per_call(fn, reps: int) -> float:
    """Seconds per call, after one warm-up call."""
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def _group(completion_tokens: int, group_size: int = 8, masked: bool = False):
    """masked: every 4th completion token is an environment token (a multi-turn episode's share)."""
    import numpy as np

    from streamrl.comm.codec import ScoredGroup

    per = max(1, completion_tokens // group_size)
    rng = np.random.default_rng(0)
    return ScoredGroup.from_samples(
        prompt_id="bench", policy_version=1, actor_id="bench", prompt_tokens=rng.integers(0, 1000, 64),
        completions=[rng.integers(0, 1000, per) for _ in range(group_size)],
        logprobs=[-rng.random(per) for _ in range(group_size)],
        rewards=rng.random(group_size), finish_reasons=["stop"] * group_size,
        model_token_masks=[np.arange(per) % 4 != 3 for _ in range(group_size)] if masked else None)


def _receiver(port: int, n: int, kind: str, ready, result) -> None:
    """Take n groups through the learner's GroupReceiver (decoded and validated), or n raw messages;
    the clock runs from the end of the first message to the last, and counts what came after it."""
    import zmq

    from streamrl.comm.groups import GroupReceiver

    ctx = zmq.Context()
    addr = f"tcp://127.0.0.1:{port}"
    if kind == "group":
        receiver = GroupReceiver(ctx, addr, hwm=64, max_bytes=1 << 30, vocab_size=1 << 20)
        sock = receiver.sock

        def take() -> int:
            while receiver.take() is None:
                sock.poll(1000)
            return 1
    else:
        sock = ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.RCVHWM, 64)
        sock.bind(addr)

        def take() -> int:
            sock.recv_multipart(copy=False)
            return 1
    ready.set()
    first = take()
    while kind == "group" and receiver.pending:  # the rest of the first message
        first += take()
    t0 = time.perf_counter()
    for _ in range(n - first):
        take()
    result.put((n - first, time.perf_counter() - t0))
    sock.close(linger=0)
    ctx.term()


def _one_way(kind: str, payload, n: int, batch_max_bytes: int = 0) -> float:
    """Groups (or raw messages) per second, process to process. kind "group": `payload` is the
    groups of one generate call, sent n times as an actor does (GroupSender.batches, send_batch);
    kind "raw": `payload` is bytes, sent n times bare."""
    import zmq

    from streamrl.comm.chunks import ZERO_COPY_MIN
    from streamrl.comm.groups import GroupSender

    port = _free_port()
    mpc = mp.get_context("spawn")
    ready, result = mpc.Event(), mpc.Queue()
    units = n * len(payload) if kind == "group" else n
    proc = mpc.Process(target=_receiver, args=(port, units, kind, ready, result))
    proc.start()
    ready.wait(30)
    ctx = zmq.Context()
    addr = f"tcp://127.0.0.1:{port}"
    if kind == "group":
        sender = GroupSender(ctx, addr, hwm=64, batch_max_bytes=batch_max_bytes)
        for _ in range(n):
            for batch in sender.batches(payload):
                sender.send_batch(batch, timeout_s=60)
        sock = sender.sock
    else:
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.SNDHWM, 64)
        sock.connect(addr)
        for _ in range(n):
            sock.send(payload, copy=len(payload) < ZERO_COPY_MIN)
    counted, elapsed = result.get(timeout=300)
    proc.join(30)
    sock.close(linger=0)
    ctx.term()
    return counted / elapsed


def _nbytes(frames) -> int:
    return sum(memoryview(f).nbytes for f in frames)


def transport(short: bool = False) -> list[dict]:
    """Small groups one per message and batched as actors send them (the default
    transport.batch_max_bytes), then 1 MB and 16 MB groups (always one per message). References:
    raw ZeroMQ moving the same messages' bytes (one frame each), raw ZeroMQ moving each group's
    bytes as its own message, and copying a group's bytes in memory. Masked: the same groups with a
    model-token mask (every 4th token the environment's), against them without, in the same pairs."""
    import numpy as np

    from streamrl.comm import codec
    from streamrl.comm.groups import batches
    from streamrl.config import TransportConfig

    cap = TransportConfig().batch_max_bytes
    rows = []
    for tokens, per_call, batch_max_bytes, n in ((32, 1, 0, 20000), (32, 64, cap, 1000),
                                                 (128 * 1024, 1, cap, 1000), (2 * 1024 * 1024, 1, cap, 60)):
        if short:
            n = max(10, n // 50)
        call = [_group(tokens) for _ in range(per_call)]
        masked = [_group(tokens, masked=True) for _ in range(per_call)]
        messages = [_nbytes(codec.encode_groups(b)) for b in batches(call, batch_max_bytes)]
        group_bytes = _nbytes(codec.encode_groups(call[:1]))
        # (streamrl, raw) measured back to back, 3 times: the pair with the median ratio is reported, so a
        # burst of load from another process moves one pair, not the figure.
        pairs, with_mask = [], []
        for _ in range(1 if short else 3):
            ours = _one_way("group", call, n, batch_max_bytes)
            with_mask.append((ours_masked := _one_way("group", masked, n, batch_max_bytes), ours_masked / ours))
            # raw ZeroMQ with the same messages: bytes of the first message, as many messages as groups need
            raw_msgs = _one_way("raw", np.random.default_rng(1).bytes(messages[0]), n * len(messages))
            pairs.append((ours / (raw_msgs * per_call / len(messages)), ours, raw_msgs * per_call / len(messages)))
        ratios = sorted(r for r, _, _ in pairs)
        _, ours, raw_same = sorted(pairs)[len(pairs) // 2]
        masked_per_s, masked_ratio = sorted(with_mask, key=lambda m: m[1])[len(with_mask) // 2]
        raw_each = raw_same if len(messages) == per_call else _one_way(
            "raw", np.random.default_rng(1).bytes(group_bytes), n * per_call)
        buf = np.random.default_rng(2).bytes(group_bytes)
        memcpy = 1 / _per_call(lambda: bytearray(buf), 10 if group_bytes > (1 << 20) else 1000)
        rows.append({"bench": "transport", "group_bytes": group_bytes, "groups_per_message": per_call / len(messages),
                     "groups_per_s": ours, "MB_per_s": ours * group_bytes / 1e6,
                     "raw_zmq_groups_per_s": raw_same, "ratio_vs_raw_zmq": ours / raw_same,
                     "ratio_vs_raw_zmq_min": ratios[0], "ratio_vs_raw_zmq_max": ratios[-1],
                     "raw_zmq_one_msg_per_group_per_s": raw_each, "ratio_vs_raw_zmq_one_msg_per_group": ours / raw_each,
                     "memcpy_groups_per_s": memcpy, "ratio_vs_memcpy": ours / memcpy,
                     "masked_groups_per_s": masked_per_s, "ratio_masked_vs_plain": masked_ratio,
                     "ratio_masked_vs_plain_min": min(r for _, r in with_mask),
                     "ratio_masked_vs_plain_max": max(r for _, r in with_mask)})
    return rows


def advantages_bench(short: bool = False) -> list[dict]:
    import torch

    from streamrl.algo import advantages

    rows = []
    for groups in (64, 4096):
        r = torch.rand(groups, 8)
        reps = 50 if short else 2000
        ours = _per_call(lambda: advantages.compute(r, "corpo", 0.75), reps)
        ref = _per_call(lambda: r - r.mean(dim=1, keepdim=True).clamp_min(0.75), reps)
        rows.append({"bench": "advantages", "groups": groups, "us_per_call": ours * 1e6,
                     "ratio_vs_bare_expression": ref / ours})
    return rows


def batching(short: bool = False) -> list[dict]:
    """learner.batch.collate (groups → padded tensors) against copying the same bytes once."""
    import numpy as np

    from streamrl.learner.batch import collate  # the benchmark drives the learner's real batcher

    rows = []
    for tokens in (32, 4096):
        groups = [_group(tokens) for _ in range(16)]
        reps = 10 if short else 200
        ours = _per_call(lambda: collate(groups, 0), reps)
        ref = _per_call(lambda: [np.concatenate([g.prompt_tokens, g.completion_tokens,
                                                 g.behaviour_logprobs.view(np.int32)]) for g in groups], reps)
        rows.append({"bench": "batching", "groups": 16, "tokens_per_group": tokens, "ms_per_batch": ours * 1e3,
                     "ratio_vs_copying_the_bytes": ref / ours})
    return rows


def _weights_subscriber(kind: str, pub_port: int, router_port: int, ack_port: int, n: int, name: str,
                        max_message: int, ready) -> None:
    """Take weight versions 0..n (0 is a tiny warm-up, possibly repeated) and ack each one to the publisher:
    streamrl through a WeightSubscriber (every chunk checked, the version complete and ready to load: what
    an actor hands its backend); raw by counting the bytes of each version's messages."""
    import numpy as np
    import zmq

    from streamrl.comm.control import Inbox
    from streamrl.comm.subscriber import WeightSubscriber

    ctx = zmq.Context()
    ack = ctx.socket(zmq.PUSH)
    ack.connect(f"tcp://127.0.0.1:{ack_port}")
    if kind == "streamrl":
        inbox = Inbox(ctx, f"tcp://127.0.0.1:{router_port}", name, max_message)
        sub = WeightSubscriber(ctx, f"tcp://127.0.0.1:{pub_port}", inbox, max_message)

        def take() -> int:
            got = None
            while got is None:
                got = sub.poll(1000)
            return got[0]
    else:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.MAXMSGSIZE, max_message)
        sub.connect(f"tcp://127.0.0.1:{pub_port}")
        have: dict[int, int] = {}

        def take() -> int:
            while True:
                head, payload = sub.recv_multipart(copy=False)
                version, total = np.frombuffer(head.buffer, dtype=np.int64)
                have[version] = have.get(version, 0) + len(payload.buffer)
                if have[version] >= total:
                    del have[version]
                    return int(version)
    ready.set()
    version = -1
    while version < n:
        version = take()
        ack.send_multipart([name.encode(), version.to_bytes(8, "little")])
    sub.close()
    if kind == "streamrl":
        inbox.close()
    ack.close(linger=1000)
    ctx.term()


class _Broadcast:
    """One publisher and `subscribers` subscriber processes of one kind, moving versions of `state` on demand.

    streamrl publishes as the learner does: publish(wait=False) (chunks sent zero-copy from the live
    tensors on a background thread), then the learner's forward/backward, modelled as `step_s`, then
    settle() before the optimizer step (it waits until nothing sent still reads the tensors); blocked =
    time in publish + time settle waited. raw: PUB/SUB of the same bytes in the same chunk sizes,
    zero-copy from the live tensor (no header but the version, no checks, no tensors built, nothing
    held back, no in-flight bound)."""

    def __init__(self, kind: str, subscribers: int, n: int, max_message: int):
        import zmq

        from streamrl.comm.weights import WeightPublisher

        self.kind, self.subscribers = kind, subscribers
        pub_port, router_port, ack_port = (_free_port() for _ in range(3))
        self.ctx = zmq.Context()
        self.acks = self.ctx.socket(zmq.PULL)
        self.acks.bind(f"tcp://127.0.0.1:{ack_port}")
        if kind == "streamrl":
            self.publisher = WeightPublisher(self.ctx, f"tcp://127.0.0.1:{pub_port}", max_message)
            self.chunk = self.publisher.chunk_bytes
        else:
            self.chunk = _chunk_bytes(max_message)
            self.pub = self.ctx.socket(zmq.PUB)
            self.pub.setsockopt(zmq.SNDHWM, 0)  # no limit: raw ZeroMQ never drops or waits here
            self.pub.bind(f"tcp://127.0.0.1:{pub_port}")
        mpc = mp.get_context("spawn")
        self.procs = []
        for i in range(subscribers):
            ready = mpc.Event()
            proc = mpc.Process(target=_weights_subscriber,
                               args=(kind, pub_port, router_port, ack_port, n, f"s{i}", max_message, ready))
            proc.start()
            self.procs.append((proc, ready))

    def publish(self, v: int, tensors: dict) -> None:
        import numpy as np
        if self.kind == "streamrl":
            self.publisher.publish(v, tensors, wait=False)
            return
        payloads = [t.numpy().reshape(-1).view(np.uint8) for t in tensors.values()]
        head = np.array([v, sum(p.nbytes for p in payloads)], dtype=np.int64).tobytes()
        for payload in payloads:  # each tensor's own memory, in frames of at most one chunk
            for start in range(0, payload.nbytes, self.chunk):
                self.pub.send_multipart([head, payload[start:start + self.chunk]], copy=False)

    def settle(self) -> None:
        if self.kind == "streamrl":
            self.publisher.settle()

    def warm_up(self, warm: dict) -> None:
        """PUB/SUB joins late: repeat the tiny version 0 until every subscriber has it."""
        for _, ready in self.procs:
            ready.wait(120)
        warmed: set[bytes] = set()
        while len(warmed) < self.subscribers:
            self.publish(0, warm)
            self.settle()
            if self.acks.poll(200):
                while self.acks.poll(0):
                    who, _ = self.acks.recv_multipart()
                    warmed.add(who)
        time.sleep(0.5)
        while self.acks.poll(0):  # repeated warm-ups acked late
            self.acks.recv_multipart()

    def version(self, v: int, state: dict, step_s: float) -> tuple[float, float]:
        """(seconds until every subscriber acked version v, seconds the publishing thread was blocked)."""
        arrivals: queue.Queue = queue.Queue()
        done = threading.Event()

        def collect() -> None:  # acks timed as they arrive, whatever the learner's thread is doing
            got: set[bytes] = set()
            while len(got) < self.subscribers and not done.is_set():
                if self.acks.poll(100):
                    who, version = self.acks.recv_multipart()
                    if int.from_bytes(version, "little") == v:
                        got.add(who)
                        arrivals.put(time.perf_counter())

        collector = threading.Thread(target=collect, daemon=True)
        collector.start()
        t0 = time.perf_counter()
        self.publish(v, state)
        blocked = time.perf_counter() - t0
        if step_s:
            time.sleep(step_s)  # the learner's forward/backward
        b0 = time.perf_counter()
        self.settle()  # the optimizer step comes next
        blocked += time.perf_counter() - b0
        collector.join(600)
        done.set()
        if arrivals.qsize() < self.subscribers:
            raise RuntimeError(f"bench weights: version {v} never reached every subscriber ({self.kind})")
        return max(arrivals.get() for _ in range(self.subscribers)) - t0, blocked

    def close(self) -> None:
        for proc, _ in self.procs:
            proc.join(60)
        self.acks.close(0)
        if self.kind == "streamrl":
            self.publisher.close()
        else:
            self.pub.close(0)
        self.ctx.term()


def _chunk_bytes(max_message: int) -> int:
    from streamrl.comm.chunks import chunk_bytes_for

    return chunk_bytes_for(max_message)


def qwen3_shaped_state(layers: int = 28, hidden: int = 1024, intermediate: int = 3072, heads: int = 16,
                       kv_heads: int = 8, head_dim: int = 128, vocab: int = 151_936) -> dict:
    """Qwen3-0.6B's tensor shapes (defaults: 28 layers, tied 151,936 x 1024 embedding) in fp32: about 2.4 GB in
    311 tensors. The embedding (622 MB) spans several chunks; every other tensor fits in one."""
    import torch

    state = {"model.embed_tokens.weight": torch.ones(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        state.update({p + "self_attn.q_proj.weight": torch.ones(heads * head_dim, hidden),
                      p + "self_attn.k_proj.weight": torch.ones(kv_heads * head_dim, hidden),
                      p + "self_attn.v_proj.weight": torch.ones(kv_heads * head_dim, hidden),
                      p + "self_attn.o_proj.weight": torch.ones(hidden, heads * head_dim),
                      p + "self_attn.q_norm.weight": torch.ones(head_dim),
                      p + "self_attn.k_norm.weight": torch.ones(head_dim),
                      p + "mlp.gate_proj.weight": torch.ones(intermediate, hidden),
                      p + "mlp.up_proj.weight": torch.ones(intermediate, hidden),
                      p + "mlp.down_proj.weight": torch.ones(hidden, intermediate),
                      p + "input_layernorm.weight": torch.ones(hidden),
                      p + "post_attention_layernorm.weight": torch.ones(hidden)})
    state["model.norm.weight"] = torch.ones(hidden)
    return state


WARM_VERSIONS = 2  # full versions each side moves before the timed ones (see `weights`)


def weights(short: bool = False) -> list[dict]:
    """A state dict published by a WeightPublisher in chunks under the message cap, to 2 WeightSubscriber
    processes (each version checked and made ready to load), against raw PUB/SUB of the same bytes in
    the same chunks to as many processes; both set up at once and their versions interleaved (raw, then
    streamrl, ...), so a change in the machine's load hits both alike. Each version is timed until every
    subscriber has it (median of the versions); the learner's step lasts as long as the raw transfer
    just before it (the step is as long as the network needs). The first WARM_VERSIONS full versions
    are not counted (their ratio is reported as first_version_ratio): until the receivers' allocator
    has seen a version freed, every version is page-faulted in anew (glibc raises its mmap threshold
    after the first frees), and a streamrl subscriber, which holds a whole version, pays that in full
    where a raw one recycles each message's buffer at once."""
    import torch

    from streamrl.config import LearnerConfig

    torch.set_num_threads(LearnerConfig().threads or torch.get_num_threads())  # as the learner publishes
    rows = []
    # (layout, state bytes, subscribers, message cap, versions): the full run moves 2 GB under the default 256 MiB
    # cap as one tensor (every chunk boundary cuts it: the subscribers copy every byte into place, the worst
    # case) and Qwen3-0.6B's layout in fp32 (2.4 GB; only the embedding is cut, the rest are views of frames).
    cases = [("one_tensor", 4 << 20, 1, 1 << 20, 3), ("one_tensor", 32 << 20, 2, 4 << 20, 3),
             ("qwen3", 0, 2, 4 << 20, 2)] if short else \
        [("one_tensor", 64 << 20, 2, 256 << 20, 5), ("one_tensor", 2 << 30, 2, 256 << 20, 3),
         ("qwen3", 0, 2, 256 << 20, 3)]
    for layout, nbytes, subscribers, cap, n in cases:
        if layout == "qwen3":  # the short pass keeps the layout's tensor count at a 64th of the bytes
            state = qwen3_shaped_state(hidden=128, intermediate=384, heads=2, kv_heads=1, head_dim=64,
                                       vocab=151_936 // 4) if short else qwen3_shaped_state()
        else:
            state = {"w": torch.ones(nbytes // 4, dtype=torch.float32)}
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        warm = {"w": torch.ones(16)}
        raw, ours = (_Broadcast(kind, subscribers, WARM_VERSIONS + n, cap) for kind in ("raw", "streamrl"))
        raw.warm_up(warm)
        ours.warm_up(warm)
        raw_s, ours_s, blocked = [], [], []
        for v in range(1, WARM_VERSIONS + n + 1):
            raw_s.append(raw.version(v, state, 0.0)[0])
            d, b = ours.version(v, state, step_s=raw_s[-1])
            ours_s.append(d)
            blocked.append(b / d)
        first = raw_s[0] / ours_s[0]
        raw_s, ours_s, blocked = raw_s[WARM_VERSIONS:], ours_s[WARM_VERSIONS:], blocked[WARM_VERSIONS:]
        copy_s = ours.publisher.copy_s / (WARM_VERSIONS + n)
        raw.close()
        ours.close()
        med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        rows.append({"bench": "weights", "layout": layout, "tensors": len(state), "MB": nbytes >> 20, "subscribers": subscribers,
                     "chunk_MB": ours.chunk / (1 << 20), "chunks": -(-nbytes // ours.chunk),
                     "s_per_version": med(ours_s), "raw_s_per_version": med(raw_s),
                     "GB_per_s_delivered": nbytes * subscribers / med(ours_s) / 1e9,
                     "ratio_vs_raw_zmq": med([r / o for r, o in zip(raw_s, ours_s)]),
                     "first_version_ratio": first,
                     "publisher_blocked_fraction": med(blocked),
                     "copy_fraction": copy_s / med(ours_s)})
    return rows


def _job(mode: str, steps: int, workdir, pin: bool) -> dict:
    """One tiny-default run (learner + 2 actors as separate processes, learner pinned to CPU 0 and the
    actors to the others when pin), returning its step records after warm-up and the actors' stats."""
    import ast
    import json
    import os
    import subprocess
    from pathlib import Path

    from streamrl.commands import launch

    g, w, r = launch.free_ports(3)
    args = [f"steps={steps}", f"on_policy={mode}", f"name={mode}", f"run_dir={workdir}",
            f"transport.group_port={g}", f"transport.weights_port={w}", f"transport.weights_request_port={r}",
            "monitoring.learner_port=0", "monitoring.actor_port=0"]
    logs = Path(workdir) / f"{mode}-logs"
    logs.mkdir(parents=True, exist_ok=True)

    def spawn(role: list[str], name: str) -> subprocess.Popen:
        return launch.spawn([*role, *args], logs / f"{name}.log")

    learner = spawn(["learner"], "learner")
    actors = [spawn(["actor", "--index", str(i)], f"actor-{i}") for i in range(2)]
    cpus = sorted(os.sched_getaffinity(0))
    if pin and len(cpus) >= 2:
        os.sched_setaffinity(learner.pid, {cpus[0]})
        for a in actors:
            os.sched_setaffinity(a.pid, set(cpus[1:]))
    for p in (learner, *actors):
        p.wait(timeout=1800)
    recs = [json.loads(x) for x in (Path(workdir) / mode / "metrics.jsonl").read_text().splitlines()]
    stats = []
    for i in range(2):
        line = [x for x in (logs / f"actor-{i}.log").read_text().splitlines() if ": done {" in x][-1]
        stats.append(ast.literal_eval(line.split(": done ", 1)[1]))
    return {"recs": recs[max(1, steps // 10):], "actors": stats}


def overlap(short: bool = False) -> list[dict]:
    """The same tiny job strict and async: the async speed-up against the ideal bound
    (t_gen + t_train) / max(t_gen, t_train) taken from the strict run's own timings; the learner's
    overhead outside forward/backward/optimizer and the actors' idle share in the async run."""
    import tempfile

    steps = 20 if short else 300
    with tempfile.TemporaryDirectory() as tmp:
        strict = _job("strict", steps, tmp, pin=True)
        fast = _job("async", steps, tmp, pin=True)
    s, a = strict["recs"], fast["recs"]
    t_gen = sum(r["wait_s"] for r in s)  # strict: the learner waits exactly while actors generate
    t_train = sum(r["step_s"] - r["wait_s"] for r in s)
    bound = (t_gen + t_train) / max(t_gen, t_train)
    speedup = sum(r["step_s"] for r in s) / sum(r["step_s"] for r in a)
    a_step = sum(r["step_s"] + r.get("metrics_s", 0) for r in a)
    overhead = sum(r["batch_s"] + r["publish_s"] + r.get("metrics_s", 0) for r in a) / a_step
    idle = sum(x["weights_wait_s"] for x in fast["actors"]) / sum(x["wall_s"] for x in fast["actors"])
    return [{"bench": "overlap", "steps": len(a), "strict_ms_per_step": 1e3 * sum(r["step_s"] for r in s) / len(s),
             "async_ms_per_step": 1e3 * sum(r["step_s"] for r in a) / len(a), "async_speedup": speedup,
             "ideal_bound": bound, "ratio_vs_ideal": speedup / bound,
             "learner_overhead_fraction": overhead,
             **{f"learner_{k}_fraction": sum(r.get(f"{k}_s", 0) for r in a) / a_step
                for k in ("batch", "publish", "metrics")},
             "learner_waiting_fraction": sum(r["wait_s"] for r in a) / a_step,
             "actor_idle_fraction": idle}]


def startup(short: bool = False) -> list[dict]:
    from streamrl.commands import bench_startup

    return bench_startup.startup(short=short)


def generate(short: bool = False) -> list[dict]:
    from streamrl.commands import bench_generate

    return bench_generate.generate(short=short)


def learner(short: bool = False) -> list[dict]:
    from streamrl.commands import bench_learner

    return bench_learner.learner(short=short)


def trl(short: bool = False) -> list[dict]:
    from streamrl.commands import bench_trl  # needs TRL installed; never part of a plain `streamrl bench`

    return bench_trl.trl(short=short)


def episodes(short: bool = False) -> list[dict]:
    from streamrl.commands import bench_episodes

    return bench_episodes.episodes(short=short)


BENCHES = {"transport": transport, "weights": weights, "overlap": overlap, "advantages": advantages_bench,
           "batching": batching, "learner": learner,
           "generate": generate, "episodes": episodes, "startup": startup}
OPTIONAL = {"trl": trl}


def run(names: list[str], short: bool) -> list[dict]:
    rows = []
    for name in names or list(BENCHES):
        bench = BENCHES.get(name) or OPTIONAL[name]
        for row in bench(short=short):
            print("  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
            rows.append(row)
    return rows
