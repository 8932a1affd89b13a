"""The hot path of one group, in process and process to process: ScoredGroup over ZeroMQ (`transport`), the
advantage estimator (`advantages`) and the learner's batcher (`batching`); each against a bare reference."""

from __future__ import annotations

import multiprocessing as mp
import socket
import time  # numpy and torch are imported inside the benches: the registry (streamrl.bench.cli) stays light


def free_port() -> int:
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
    """masked: a multi-turn episode's group: every 4th completion token is an environment token, and each sample
    carries its turns (4: model, tool, model, environment) as episodes do."""
    import numpy as np

    from streamrl.comm.codec import ScoredGroup
    from streamrl.comm.turn_spans import TurnSpan

    per = max(4, completion_tokens // group_size)
    rng = np.random.default_rng(0)
    q = per // 4
    turns = [TurnSpan("model", q), TurnSpan("tool", q, ("lookup",)), TurnSpan("model", q),
             TurnSpan("environment", per - 3 * q)]
    return ScoredGroup.from_samples(
        prompt_id="bench", policy_version=1, actor_id="bench", prompt_tokens=rng.integers(0, 1000, 64),
        completions=[rng.integers(0, 1000, per) for _ in range(group_size)],
        logprobs=[-rng.random(per) for _ in range(group_size)],
        rewards=rng.random(group_size), finish_reasons=["stop"] * group_size,
        model_token_masks=[np.arange(per) % 4 != 3 for _ in range(group_size)] if masked else None,
        spans=[turns] * group_size if masked else None)


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

    from streamrl.comm.groups import GroupSender
    from streamrl.comm.weights.chunks import ZERO_COPY_MIN

    port = free_port()
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


def _codec_turns_ratio(masked: list, rounds: int, reps: int) -> float:
    """Speed of encode + decode in process of episode groups with their turns, against the same groups without:
    the best CPU time of alternating rounds, so other processes' load moves neither side."""
    import msgspec

    from streamrl.comm import codec

    bare = [msgspec.structs.replace(g, samples=[msgspec.structs.replace(s, turn_layout=None, turn_tools=None)
                                                for s in g.samples]) for g in masked]
    best = {"turns": float("inf"), "bare": float("inf")}
    for _ in range(rounds):
        for name, groups in (("bare", bare), ("turns", masked)):
            t0 = time.process_time()
            for _ in range(reps):
                codec.decode_groups([bytes(memoryview(f).cast("B")) for f in codec.encode_groups(groups)])
            best[name] = min(best[name], time.process_time() - t0)
    return best["bare"] / best["turns"]


def _nbytes(frames) -> int:
    return sum(memoryview(f).nbytes for f in frames)


def transport(short: bool = False) -> list[dict]:
    """Small groups one per message and batched as actors send them (the default
    transport.batch_max_bytes), then 1 MB and 16 MB groups (always one per message). References:
    raw ZeroMQ moving the same messages' bytes (one frame each), raw ZeroMQ moving each group's
    bytes as its own message, and copying a group's bytes in memory. Masked: the same groups as episodes send them,
    with a model-token mask (every 4th token the environment's) and 4 turns a sample, against them without, in the
    same pairs; and the codec alone, in process, on the masked groups with their turns against without them."""
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
                     "ratio_masked_vs_plain_max": max(r for _, r in with_mask),
                     "codec_ratio_turns_vs_none": _codec_turns_ratio(masked, 3 if short else 15,
                                                                     max(1, min(n, 20000 // per_call) // 20))})
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

