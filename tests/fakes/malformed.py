"""Malformed messages for fuzzing every socket: random bytes, truncated and extra frames, wrong tags
and schema versions, and well-formed messages with wrong content. Deterministic for a seed.

Each maker returns (kind, frames). Every message a receiver must reject (a group receiver declaring the
reward scale `REWARD_RANGE`); `future` groups are
valid on the wire and the learner's gate drops them instead, so they are kept apart.
"""

from __future__ import annotations

import math
import random

import msgspec
import numpy as np

from streamrl.comm import codec, wire

REWARD_RANGE = (0.0, 1.0)  # the scale a fuzzed group receiver declares: the valid groups' rewards are 1.0 and 0.0
VOCAB = 64  # the tiny job's vocabulary is larger; the fuzzer only uses ids that are out of range on purpose


def _group(rng: random.Random, **header_changes) -> list[bytes]:
    g = codec.ScoredGroup.from_samples(
        prompt_id=f"p{rng.randrange(1000)}", policy_version=0, actor_id="fuzz", prompt_tokens=[1, 2, 3],
        completions=[[4, 5], [6]], logprobs=[[-0.5, -1.0], [-2.0]], rewards=[1.0, 0.0],
        finish_reasons=["stop", "length"])
    frames = [bytes(memoryview(f)) for f in codec.encode_groups([g])]
    if header_changes:  # a single group is a batch of one: its fields are in the batch header or its entry
        header = msgspec.msgpack.decode(frames[0])
        for name, value in header_changes.items():
            if name in _ENTRY_FIELDS:
                header["groups"][0][_ENTRY_FIELDS.index(name)] = value
            else:
                header[name] = value
        frames[0] = msgspec.msgpack.encode(header)
    return frames


_ENTRY_FIELDS = ["prompt_id", "policy_version", "num_prompt_tokens", "samples", "created_at", "seq", "layer"]


def _arrays(frames: list[bytes], tokens=None, logprobs=None, prompt=None) -> list[bytes]:
    out = list(frames)
    if prompt is not None:
        out[1] = np.asarray(prompt, dtype=wire.TOKEN_DTYPE).tobytes()
    if tokens is not None:
        out[2] = np.asarray(tokens, dtype=wire.TOKEN_DTYPE).tobytes()
    if logprobs is not None:
        out[3] = np.asarray(logprobs, dtype=wire.LOGPROB_DTYPE).tobytes()
    return out


def _batch(rng: random.Random, entry: int | None = None, **entry_changes) -> list[bytes]:
    """A valid batch of 2-4 groups, with `entry_changes` made to one group's header (`entry`, or a random one)."""
    groups = []
    for i in range(rng.randrange(2, 5)):
        g = codec.ScoredGroup.from_samples(
            prompt_id=f"p{rng.randrange(1000)}", policy_version=0, actor_id="fuzz", prompt_tokens=[1, 2, 3][: i + 1],
            completions=[[4, 5], [6]], logprobs=[[-0.5, -1.0], [-2.0]], rewards=[1.0, 0.0],
            finish_reasons=["stop", "length"])
        g.session, g.seq = "fuzz-session", i
        groups.append(g)
    frames = [bytes(memoryview(f)) for f in codec.encode_groups(groups)]
    if entry_changes:
        header = msgspec.msgpack.decode(frames[0])
        k = rng.randrange(len(groups)) if entry is None else entry
        for name, value in entry_changes.items():
            header["groups"][k][_ENTRY_FIELDS.index(name)] = value
        frames[0] = msgspec.msgpack.encode(header)
    return frames


def _resize(frames: list[bytes], index: int, delta: int) -> list[bytes]:
    out = list(frames)
    out[index] = out[index][:delta] if delta < 0 else out[index] + bytes(delta)
    return out


def _poke(rng: random.Random, frames: list[bytes], index: int, value) -> list[bytes]:
    """frames with one random element of bulk frame `index` (1, 2: tokens; 3: log-probs) set to `value`."""
    arr = np.frombuffer(frames[index], dtype=wire.LOGPROB_DTYPE if index == 3 else wire.TOKEN_DTYPE).copy()
    arr[rng.randrange(arr.size)] = value
    return [*frames[:index], arr.tobytes(), *frames[index + 1:]]


def _samples(*rows) -> list:
    return [list(r) for r in rows]


MAKERS = {
    "random_bytes": lambda r: [r.randbytes(r.randrange(0, 300))],
    "random_frames": lambda r: [r.randbytes(r.randrange(0, 64)) for _ in range(r.randrange(1, 8))],
    "empty_frame": lambda r: [b""],
    "truncated": lambda r: _group(r)[: r.randrange(1, 4)],
    "extra_frames": lambda r: _group(r) + [r.randbytes(8) for _ in range(r.randrange(1, 4))],
    "wrong_tag": lambda r: _group(r, type=r.choice(["nope", "weights", "", "scored_groupX"])),
    "wrong_schema": lambda r: _group(r, schema=r.choice([0, wire.SCHEMA_VERSION - 1, wire.SCHEMA_VERSION + 1, 99, -1])),
    "wrong_field_type": lambda r: _group(r, policy_version=r.choice(["3", None, 1.5, [1]])),
    "truncated_header": lambda r: [_group(r)[0][: r.randrange(1, 20)], *_group(r)[1:]],
    "length_mismatch": lambda r: _arrays(_group(r), tokens=[4, 5, 6, 7, 8]),
    "negative_length": lambda r: _group(r, samples=_samples((-1, 1.0, "stop"), (4, 0.0, "stop"))),
    "nan_reward": lambda r: _group(r, samples=_samples((2, math.nan, "stop"), (1, 0.0, "length"))),
    "inf_reward": lambda r: _group(r, samples=_samples((2, r.choice([math.inf, -math.inf]), "stop"),
                                                       (1, 0.0, "length"))),
    # well-formed, finite, and outside the run's reward scale (the fuzz receivers declare [0, 1])
    "reward_above_scale": lambda r: _group(r, samples=_samples((2, r.choice([1e30, 3e38, 1.5]), "stop"),
                                                               (1, 0.0, "length"))),
    "reward_below_scale": lambda r: _group(r, samples=_samples((2, r.choice([-1e30, -0.5]), "stop"), (1, 0.0, "stop"))),
    "batch_reward_above_scale": lambda r: _batch(r, samples=_samples((2, 1e30, "stop"), (1, 0.0, "stop"))),
    "nan_logprob": lambda r: _arrays(_group(r), logprobs=[math.nan, -1.0, -2.0]),
    "inf_logprob": lambda r: _arrays(_group(r), logprobs=[-math.inf, -1.0, -2.0]),
    "positive_logprob": lambda r: _arrays(_group(r), logprobs=[0.5, -1.0, -2.0]),
    "token_too_big": lambda r: _arrays(_group(r), tokens=[4, 10**6, 6]),
    "negative_token": lambda r: _arrays(_group(r), prompt=[1, -5, 3]),
    "negative_version": lambda r: _group(r, policy_version=-r.randrange(1, 10**6)),
    "negative_seq": lambda r: _group(r, seq=-r.randrange(2, 100)),
    "empty_group": lambda r: _group(r, samples=[]),
    "empty_prompt": lambda r: _arrays(_group(r, num_prompt_tokens=0), prompt=[]),
    "absurd_size": lambda r: _group(r, num_prompt_tokens=10**12),
    "bad_finish_reason": lambda r: _group(r, samples=_samples((2, 1.0, "exploded"), (1, 0.0, "stop"))),
    "bad_utf8": lambda r: [_group(r)[0].replace(b"fuzz", b"\xff\xfe\xfd\xfc"), *_group(r)[1:]],
    "deep_nesting": lambda r: [b"\x91" * 5000 + b"\x00"],
    "batch_truncated": lambda r: _batch(r)[: r.randrange(1, 4)],
    "batch_extra_frames": lambda r: _batch(r) + [r.randbytes(8)],
    "batch_empty": lambda r: [msgspec.msgpack.encode({"type": "scored_group_batch", "schema": wire.SCHEMA_VERSION, "actor_id": "f",
                                                      "groups": []}), b"", b"", b""],
    "batch_frames_short": lambda r: _resize(_batch(r), r.randrange(1, 4), -4 * r.randrange(1, 3)),
    "batch_frames_long": lambda r: _resize(_batch(r), r.randrange(1, 4), 4 * r.randrange(1, 3)),
    "batch_entry_claims_more": lambda r: _batch(r, num_prompt_tokens=r.randrange(4, 10**6)),
    "batch_negative_length": lambda r: _batch(r, samples=_samples((-2, 1.0, "stop"), (5, 0.0, "stop"))),
    "batch_nan_reward": lambda r: _batch(r, samples=_samples((2, math.nan, "stop"), (1, 0.0, "stop"))),
    "batch_negative_version": lambda r: _batch(r, policy_version=-r.randrange(1, 10**6)),
    "batch_negative_seq": lambda r: _batch(r, seq=-r.randrange(2, 100)),
    "batch_empty_group": lambda r: _batch(r, samples=[]),
    "batch_wrong_entry_type": lambda r: _batch(r, created_at=r.choice(["now", None, [1.0]])),
    "batch_bad_logprob": lambda r: _poke(r, _batch(r), 3, r.choice([math.nan, math.inf, 0.5])),
    "batch_token_too_big": lambda r: _poke(r, _batch(r), r.choice([1, 2]), r.choice([10**6, -5])),
    "weights_on_group_channel": lambda r: _chunk(r),
    # model-token masks: _group's completions hold 2 + 1 tokens
    "mask_short": lambda r: [*_group(r), bytes([1] * r.randrange(0, 3))],
    "mask_long": lambda r: [*_group(r), bytes([1] * r.randrange(4, 9))],
    "mask_not_0_or_1": lambda r: [*_group(r), bytes([1, r.randrange(2, 256), 1])],
    "mask_all_environment": lambda r: [*_group(r), bytes(r.choice([[0, 0, 1], [1, 1, 0], [0, 0, 0]]))],
}


def messages(n: int, seed: int = 0) -> list[tuple[str, list[bytes]]]:
    """n malformed messages, cycling through every kind, in a shuffled order."""
    rng = random.Random(seed)
    kinds = sorted(MAKERS)
    out = [(kinds[i % len(kinds)], MAKERS[kinds[i % len(kinds)]](rng)) for i in range(n)]
    rng.shuffle(out)
    return out


def future_group(rng: random.Random, group_size: int) -> list[bytes]:
    """Valid on the wire, from a policy version the learner never published (its gate drops it)."""
    g = codec.ScoredGroup.from_samples(
        prompt_id=f"p{rng.randrange(1000)}", policy_version=10**9, actor_id="fuzz", prompt_tokens=[1, 2],
        completions=[[3]] * group_size, logprobs=[[-1.0]] * group_size, rewards=[0.0] * group_size,
        finish_reasons=["stop"] * group_size)
    return [bytes(memoryview(f)) for f in codec.encode_groups([g])]


def _chunk(rng: random.Random, payload: bytes | None = None, **changes) -> list[bytes]:
    """A weights chunk (2 float32 tensors, 64 bytes, one chunk) with `changes` made to its header."""
    header = {"type": "weights_chunk", "schema": wire.SCHEMA_VERSION, "version": 1, "tensors": [["a", "float32", [4]],
              ["b", "float32", [4]]], "offsets": [0, 16], "total": 64, "chunk_bytes": 1 << 20, "index": 0}
    header.update(changes)
    return [msgspec.msgpack.encode(header), bytes(64) if payload is None else payload]


WEIGHT_MAKERS = {
    "random_bytes": MAKERS["random_bytes"],
    "random_frames": MAKERS["random_frames"],
    "wrong_schema": lambda r: _chunk(r, schema=7),
    "frame_count": lambda r: _chunk(r)[:1],
    "extra_frames": lambda r: _chunk(r) + [b"x"],
    "negative_version": lambda r: _chunk(r, version=-3),
    "duplicate_tensor": lambda r: _chunk(r, tensors=[["w", "float32", [1]], ["w", "float32", [1]]], offsets=[0, 4],
                                         total=8, payload=bytes(8)),
    "bad_shape": lambda r: _chunk(r, tensors=[["w", "float32", [-1]]], offsets=[0], total=0, payload=b""),
    "bad_dtype": lambda r: _chunk(r, tensors=[["w", "pickle", [1]]], offsets=[0], total=4, payload=bytes(4)),
    "absurd_size": lambda r: _chunk(r, tensors=[["w", "float32", [10**9, 10**9]]], offsets=[0], total=4,
                                    payload=bytes(4)),
    "absurd_total": lambda r: _chunk(r, tensors=[["w", "float32", [2**60]]], offsets=[0], total=2**62,
                                     chunk_bytes=64),
    "length_mismatch": lambda r: _chunk(r, payload=bytes(r.choice([0, 60, 68]))),
    "group_on_weight_channel": lambda r: _group(r),
    "overlap": lambda r: _chunk(r, offsets=[0, r.choice([4, 8, 12])]),
    "past_end": lambda r: _chunk(r, offsets=[r.choice([4, 64, 2**40]), 80]),
    "misaligned": lambda r: _chunk(r, offsets=[2, 18]),
    "bad_index": lambda r: _chunk(r, index=r.choice([-1, 1, 2**40])),
    "zero_chunk_bytes": lambda r: _chunk(r, chunk_bytes=0),
}


def weight_messages(n: int, seed: int = 0) -> list[tuple[str, list[bytes]]]:
    rng = random.Random(seed)
    kinds = sorted(WEIGHT_MAKERS)
    return [(kinds[i % len(kinds)], WEIGHT_MAKERS[kinds[i % len(kinds)]](rng)) for i in range(n)]
