"""`streamrl bench weights`: a state dict from one WeightPublisher to 2 WeightSubscriber processes, against raw
PUB/SUB of the same bytes in the same chunks."""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time

from streamrl.bench.groups import free_port


def _weights_subscriber(kind: str, pub_port: int, router_port: int, ack_port: int, n: int, name: str,
                        max_message: int, ready) -> None:
    """Take weight versions 0..n (0 is a tiny warm-up, possibly repeated) and ack each one to the publisher:
    streamrl through a WeightSubscriber (every chunk checked, the version complete and ready to load: what
    an actor hands its backend); raw by counting the bytes of each version's messages."""
    import numpy as np
    import zmq

    from streamrl.comm.control import Inbox
    from streamrl.comm.weights.subscriber import WeightSubscriber

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

        from streamrl.comm.weights.publisher import WeightPublisher

        self.kind, self.subscribers = kind, subscribers
        pub_port, router_port, ack_port = (free_port() for _ in range(3))
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
    from streamrl.comm.weights.chunks import chunk_bytes_for

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
        raw = _Broadcast("raw", subscribers, WARM_VERSIONS + n, cap)
        ours = _Broadcast("streamrl", subscribers, WARM_VERSIONS + 3 * n, cap)  # and 2n short-step versions
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
        in_place, host_copy = _short_step_blocked(ours, state, WARM_VERSIONS + n + 1, n)
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
                     "copy_fraction": copy_s / med(ours_s),
                     "short_step_blocked_s_in_place": med(in_place), "short_step_blocked_s_host_copy": med(host_copy),
                     "host_copy_blocked_ratio": med(host_copy) / med(in_place)})
    return rows


def _short_step_blocked(ours: _Broadcast, state: dict, first: int, n: int) -> tuple[list[float], list[float]]:
    """The learner's blocked seconds per version when its step is far shorter than the transfer (a GPU's: 0.14 s
    against 0.93 s at 0.75B): sent from the parameters (the default on the CPU) against copied whole into host memory
    first (transport.weights_host_copy, the default on a GPU at max_staleness >= 4), n versions each, alternated on
    the same sockets and subscribers. The publisher takes either encoder; each version is delivered before the next
    is published."""
    from streamrl.comm.weights import encoders

    in_place, host = encoders.FullEncoder(), encoders.HostCopyEncoder()
    out: tuple[list[float], list[float]] = ([], [])
    for k in range(2 * n):
        ours.publisher.flush()
        ours.publisher.encoder = (in_place, host)[k % 2]
        out[k % 2].append(ours.version(first + k, state, step_s=0.0)[1])
    ours.publisher.flush()
    ours.publisher.encoder = in_place
    return out
