"""streamrl.comm.wire: round trips, and every kind of bad input is a WireError with its reason label."""

from __future__ import annotations

import ast
import io
import math
import time
import tokenize
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch

from streamrl.comm import codec, turn_spans, wire
from streamrl.comm.weights import assembly, chunks
from streamrl.comm.wire import GroupBatchHeader, GroupEntry, SampleInfo, WireError

REPO = Path(__file__).resolve().parents[3]
VOCAB = 32


def to_bytes(frames) -> list[bytes]:
    """What a socket delivers: every frame as plain bytes."""
    return [f if isinstance(f, bytes) else bytes(memoryview(f).cast("B")) for f in frames]


def make_group(**kw) -> codec.ScoredGroup:
    args = dict(
        prompt_id="copy-abca",
        policy_version=3,
        actor_id="actor-1",
        prompt_tokens=[5, 6, 7, 8],
        completions=[[9, 10, 1], [11], [], [12, 13]],
        logprobs=[[-0.5, -1.25, -0.125], [-2.0], [], [-0.0, -3.5]],
        rewards=[1.0, 0.25, 0.0, 0.5],
        finish_reasons=["stop", "length", "stop", "length"],
    )
    args.update(kw)
    return codec.ScoredGroup.from_samples(**args)


def encode_group(g: codec.ScoredGroup) -> list:
    """A single group's message: a batch of one."""
    return codec.encode_groups([g])


def decode_group(frames, **kw) -> codec.ScoredGroup:
    back = codec.decode_groups(frames, **kw)
    assert len(back) == 1
    return back[0]


def group_frames(**header_kw) -> list[bytes]:
    """Frames of a hand-made group: 2 prompt tokens, samples of 2 and 1 tokens."""
    entry = dict(
        prompt_id="p",
        policy_version=0,
        num_prompt_tokens=2,
        samples=[SampleInfo(2, 1.0, "stop"), SampleInfo(1, 0.0, "length")],
        created_at=1.0,
    )
    batch = dict(actor_id="a")
    prompt = header_kw.pop("prompt", np.array([3, 4], np.int32))
    tokens = header_kw.pop("tokens", np.array([5, 6, 7], np.int32))
    logprobs = header_kw.pop("logprobs", np.array([-0.5, -1.0, -2.0], np.float32))
    for k, v in header_kw.items():
        (batch if k in ("schema", "actor_id", "session", "sent_at") else entry)[k] = v
    header = GroupBatchHeader(**batch, groups=[GroupEntry(**entry)])
    return to_bytes([msgspec.msgpack.encode(header), prompt, tokens, logprobs])


def reason(fn, *args, **kw) -> str:
    with pytest.raises(WireError) as e:
        fn(*args, **kw)
    return e.value.reason


# --- round trips ------------------------------------------------------------------------------


def test_scored_group_round_trips_with_identical_arrays_and_fields():
    g = make_group()
    before = time.time()
    frames = encode_group(g)
    assert len(frames) == 4
    back = decode_group(to_bytes(frames), vocab_size=VOCAB)
    for name in ("prompt_tokens", "completion_tokens", "behaviour_logprobs"):
        a, b = getattr(g, name), getattr(back, name)
        assert a.dtype == b.dtype
        assert np.array_equal(a, b)
    for name in ("prompt_id", "policy_version", "actor_id", "samples", "created_at"):
        assert getattr(back, name) == getattr(g, name)
    assert back.sent_at >= before
    assert back.rewards == [1.0, 0.25, 0.0, 0.5]
    assert [s.finish_reason for s in back.samples] == ["stop", "length", "stop", "length"]
    for i in range(4):
        assert np.array_equal(back.sample_tokens(i), g.sample_tokens(i))
        assert np.array_equal(back.sample_logprobs(i), g.sample_logprobs(i))


def test_the_census_of_filtered_groups_a_group_carries_round_trips_and_is_absent_by_default():
    carried = wire.FilteredCensus(groups=2, failed_pos=0, failed_nonpos=8, passed_pos=0, passed_nonpos=8)
    g, plain = make_group(), make_group()
    g.filtered = carried
    back = codec.decode_groups(to_bytes(codec.encode_groups([g, plain])), vocab_size=VOCAB)
    assert back[0].filtered == carried and back[1].filtered is None
    assert carried + carried == wire.FilteredCensus(4, 0, 16, 0, 16)


def test_a_sample_span_newer_than_its_group_travels_and_an_older_or_equal_one_is_left_out():
    g = make_group(last_versions=[5, 3, None, 2])  # 3 (the group's own) and 2 (older) say nothing new
    back = decode_group(to_bytes(encode_group(g)), vocab_size=VOCAB)
    assert [s.last_version for s in back.samples] == [5, None, None, None]
    assert back.last_versions == [5, 3, 3, 3]
    batch = codec.decode_groups(to_bytes(codec.encode_groups([g, make_group()])), vocab_size=VOCAB)
    assert [b.last_versions for b in batch] == [[5, 3, 3, 3], [3, 3, 3, 3]]


def test_a_sample_whose_last_version_precedes_its_group_is_bad_version_span():
    frames = group_frames(policy_version=4, samples=[SampleInfo(2, 1.0, "stop", last_version=3),
                                                     SampleInfo(1, 0.0, "length")])
    with pytest.raises(WireError, match="last_version 3 is older than the group's policy_version 4") as e:
        decode_group(frames, vocab_size=VOCAB)
    assert e.value.reason == "bad_version_span"


def test_group_arrays_travel_as_separate_zero_copy_frames():
    g = make_group()
    frames = encode_group(g)
    assert np.shares_memory(frames[1], g.prompt_tokens)
    assert np.shares_memory(frames[2], g.completion_tokens)
    assert np.shares_memory(frames[3], g.behaviour_logprobs)


def test_the_header_size_does_not_grow_with_the_completions():
    def header_len(n: int) -> int:
        g = make_group(completions=[[1] * n, [2] * n], logprobs=[[-1.0] * n, [-1.0] * n], rewards=[0.0, 1.0],
                       finish_reasons=["length", "length"], prompt_tokens=[3] * 300)
        return len(encode_group(g)[0])

    assert header_len(300) == header_len(30000)


def test_from_samples_flattens_completions_with_offsets():
    g = make_group()
    assert g.group_size == 4
    assert g.offsets.tolist() == [0, 3, 4, 4, 6]
    assert g.sample_tokens(3).tolist() == [12, 13]
    assert g.sample_tokens(2).size == 0
    assert g.prompt_tokens.dtype == np.int32 and g.behaviour_logprobs.dtype == np.float32


@pytest.mark.parametrize(
    "state",
    [
        {"w": torch.randn(3, 5), "b": torch.randn(5)},
        {"w": torch.randn(4, 2).to(torch.bfloat16)},
        {"empty": torch.empty(0, 3)},
        {"scalar": torch.tensor(2.5)},
        {"mixed_f32": torch.arange(6.0).reshape(2, 3), "mixed_bf16": torch.ones(2, dtype=torch.bfloat16),
         "ints": torch.arange(4, dtype=torch.int64), "t": torch.randn(3, 4).t()},
    ],
    ids=["float32", "bfloat16", "empty", "zero_dim", "mixed"],
)
@pytest.mark.parametrize("chunk_bytes", [1 << 20, 64, 8], ids=["one_chunk", "chunks", "tiny_chunks"])
@pytest.mark.parametrize("in_pieces", [False, True], ids=["copied", "in_pieces"])
def test_weights_round_trip_in_one_chunk_or_many(state, chunk_bytes, in_pieces):
    messages = [to_bytes(m) for m in chunks.encode_weights(7, state, chunk_bytes=chunk_bytes, in_pieces=in_pieces)]
    assert all(sum(len(f) for f in m[1:]) <= chunk_bytes for m in messages)
    version, back = assembly.decode_weights(messages[::-1])  # any order
    assert version == 7
    assert list(back) == list(state)
    for name, t in state.items():
        assert back[name].dtype == t.dtype
        assert back[name].shape == t.shape
        assert torch.equal(back[name], t)


def batch_of(*groups: codec.ScoredGroup) -> list[codec.ScoredGroup]:
    """Groups as a GroupSender stamps them: one session, seq 0, 1, 2, ..."""
    for i, g in enumerate(groups):
        g.session, g.seq = "s1", i
    return list(groups)


def three_groups() -> list[codec.ScoredGroup]:
    return batch_of(make_group(), make_group(prompt_id="b", policy_version=4, prompt_tokens=[1],
                                             completions=[[2, 3, 4, 5]], logprobs=[[-1.0] * 4], rewards=[0.5],
                                             finish_reasons=["length"]),
                    make_group(prompt_id="c", policy_version=0))


def test_a_batch_round_trips_every_group_with_its_own_fields_seq_and_arrays():
    groups = three_groups()
    frames = codec.encode_groups(groups)
    assert len(frames) == 4  # whatever the group count: header + the three bulk frames
    back = codec.decode_groups(to_bytes(frames), vocab_size=VOCAB)
    assert len(back) == 3
    for g, b in zip(groups, back):
        for name in ("prompt_id", "policy_version", "actor_id", "samples", "created_at", "session", "seq"):
            assert getattr(b, name) == getattr(g, name)
        for name in ("prompt_tokens", "completion_tokens", "behaviour_logprobs"):
            assert getattr(b, name).dtype == getattr(g, name).dtype
            assert np.array_equal(getattr(b, name), getattr(g, name))
    assert [b.seq for b in back] == [0, 1, 2]


def test_encoding_a_batch_of_two_actor_sessions_is_refused():
    a, b = three_groups()[:2]
    b.session = "s2"
    with pytest.raises(ValueError, match="one actor session"):
        codec.encode_groups([a, b])


def batch_frames(groups=None, **entry_changes) -> list[bytes]:
    """Frames of a batch of three groups, with `entry_changes` applied to the middle group's header."""
    frames = to_bytes(codec.encode_groups(groups or three_groups()))
    if entry_changes:
        header = msgspec.msgpack.decode(frames[0])
        fields = ["prompt_id", "policy_version", "num_prompt_tokens", "samples", "created_at", "seq", "layer", "filtered"]
        for k, v in entry_changes.items():
            header["groups"][1][fields.index(k)] = v
        frames[0] = msgspec.msgpack.encode(header)
    return frames


@pytest.mark.parametrize("frame,cut", [(1, 4), (2, 4), (3, 4), (2, -4), (3, -4)],
                         ids=["prompt_short", "tokens_short", "logprobs_short", "tokens_long", "logprobs_long"])
def test_batch_lengths_that_do_not_add_up_to_its_frames_are_length_mismatch(frame, cut):
    frames = batch_frames()
    frames[frame] = frames[frame][:-cut] if cut > 0 else frames[frame] + bytes(-cut)
    assert reason(codec.decode_groups, frames) == "length_mismatch"


def test_a_batch_whose_middle_group_claims_more_tokens_than_sent_is_length_mismatch():
    assert reason(codec.decode_groups, batch_frames(num_prompt_tokens=3)) == "length_mismatch"
    assert reason(codec.decode_groups, batch_frames(samples=[[5, 0.5, "length"]])) == "length_mismatch"


def test_a_batch_without_groups_is_empty_batch():
    header = msgspec.msgpack.encode(wire.GroupBatchHeader(actor_id="a", groups=[]))
    assert reason(codec.decode_groups, [header, b"", b"", b""]) == "empty_batch"


def test_a_batch_with_missing_or_extra_frames_is_frame_count():
    frames = batch_frames()
    assert reason(codec.decode_groups, frames[:3]) == "frame_count"
    assert reason(codec.decode_groups, [*frames, b"x", b"y"]) == "frame_count"
    assert reason(codec.decode_groups, [*frames, b"x"]) == "length_mismatch"  # a fifth is a model-token mask


def test_a_single_group_is_a_batch_of_one_whose_frames_are_its_own_arrays():
    g = make_group()
    frames = codec.encode_groups([g])
    assert msgspec.msgpack.decode(frames[0])["type"] == "scored_group_batch"
    assert np.shares_memory(frames[2], g.completion_tokens)
    assert len(codec.decode_groups(to_bytes(frames))) == 1


@pytest.mark.parametrize("changes,expected", [
    ({"policy_version": -1}, "bad_version"),
    ({"seq": -2}, "bad_seq"),
    ({"num_prompt_tokens": 0}, "empty_prompt"),
    ({"samples": []}, "empty_group"),
    ({"samples": [[-1, 0.5, "length"]]}, "length_mismatch"),
    ({"samples": [[4, math.nan, "length"]]}, "non_finite_reward"),
    ({"samples": [[4, -math.inf, "length"]]}, "non_finite_reward"),
    ({"samples": [[4, 0.5, "exploded"]]}, "bad_header"),
    ({"samples": [[4, 0.5, "length", None, 2]], "policy_version": 3}, "bad_version_span"),
    ({"filtered": [1, 0, -8, 0, 0]}, "bad_filtered"),
    ({"filtered": [1, 0, 8]}, "bad_header"),
])
def test_one_bad_group_header_rejects_the_whole_batch_with_the_reason_it_gets_alone(changes, expected):
    assert reason(codec.decode_groups, batch_frames(**changes), vocab_size=VOCAB) == expected


@pytest.mark.parametrize("bad,expected", [(math.nan, "non_finite_logprob"), (math.inf, "non_finite_logprob"),
                                          (0.5, "bad_logprob")])
def test_one_bad_log_prob_in_a_batch_rejects_it(bad, expected):
    groups = three_groups()
    groups[1].behaviour_logprobs[2] = bad
    assert reason(codec.decode_groups, batch_frames(groups)) == expected


@pytest.mark.parametrize("bad", [VOCAB, -1])
def test_one_out_of_vocabulary_token_in_a_batch_rejects_it(bad):
    groups = three_groups()
    groups[2].completion_tokens[0] = bad
    assert reason(codec.decode_groups, batch_frames(groups), vocab_size=VOCAB) == "token_out_of_range"


def test_huge_but_finite_rewards_whose_sum_overflows_are_accepted():
    groups = batch_of(make_group(rewards=[1.7e308, 1.7e308, 0.0, 0.0]))
    assert codec.decode_groups(to_bytes(codec.encode_groups(groups)))[0].rewards[0] == 1.7e308
    assert decode_group(to_bytes(encode_group(groups[0]))).rewards[1] == 1.7e308


# --- bad input --------------------------------------------------------------------------------


def test_bytes_that_are_not_msgpack_are_bad_frame():
    assert reason(decode_group, [b"\xc1", b"", b"", b""]) == "bad_frame"
    assert reason(wire.decode_header, [b"\xc1garbage"]) == "bad_frame"


def test_random_frames_always_raise_wire_error():
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(1000):
        frames = [rng.integers(0, 256, size=int(rng.integers(1, 40)), dtype=np.uint8).tobytes()
                  for _ in range(int(rng.integers(1, 6)))]
        for fn in (decode_group, decode_weights, wire.decode_header):
            with pytest.raises(WireError) as e:
                fn(frames)
            seen.add(e.value.reason)
    assert seen <= {"bad_frame", "bad_header"}


def test_an_empty_frame_list_is_empty():
    assert reason(decode_group, []) == "empty"
    assert reason(decode_weights, []) == "empty"


def test_a_truncated_frame_list_is_frame_count():
    frames = to_bytes(encode_group(make_group()))
    assert reason(decode_group, frames[:3]) == "frame_count"
    assert reason(decode_group, frames[:1]) == "frame_count"


def test_extra_frames_are_frame_count():
    frames = to_bytes(encode_group(make_group()))
    assert reason(decode_group, [*frames, b"x", b"y"]) == "frame_count"
    wframes = to_bytes(chunks.encode_weights(0, {"w": torch.ones(2)})[0])
    assert reason(decode_weights, [*wframes, b"", b"", b""]) == "frame_count"  # one tensor: 4 frames at most
    assert reason(decode_weights, wframes[:1]) == "frame_count"


def test_an_unknown_type_tag_is_bad_header():
    frames = to_bytes(encode_group(make_group()))
    unknown = msgspec.msgpack.encode({"type": "nope", "schema": 1})
    assert reason(decode_group, [unknown, *frames[1:]]) == "bad_header"
    assert reason(wire.decode_header, [msgspec.msgpack.encode({"schema": 1})]) == "bad_header"
    assert reason(wire.decode_header, [msgspec.msgpack.encode([1, 2, 3])]) == "bad_header"


def test_a_header_with_a_wrong_field_type_is_bad_header():
    bad_finish = [SampleInfo(2, 1.0, "exploded"), SampleInfo(1, 0.0, "stop")]
    assert reason(decode_group, group_frames(samples=bad_finish)) == "bad_header"
    raw = msgspec.msgpack.encode({"type": "scored_group", "schema": 1, "prompt_id": "p", "policy_version": "3",
                                  "actor_id": "a", "num_prompt_tokens": 0, "samples": [], "created_at": 0.0})
    assert reason(wire.decode_header, [raw]) == "bad_header"


def test_a_peer_of_another_schema_version_is_refused_with_both_versions_named():
    assert wire.SCHEMA_VERSION == 2  # 2: groups may carry a model-token mask
    with pytest.raises(WireError, match="GroupBatchHeader schema 1, this build speaks 2") as e:
        decode_group(group_frames(schema=1))  # an actor from before model-token masks
    assert e.value.reason == "schema_version"
    assert reason(decode_group, group_frames(schema=3)) == "schema_version"
    hdr = msgspec.msgpack.encode(wire.WeightsChunk(version=0, tensors=[], offsets=[], total=0, chunk_bytes=8,
                                                   schema=1))
    with pytest.raises(WireError, match="WeightsChunk schema 1, this build speaks 2"):
        decode_weights([hdr, b""])  # a learner from before them
    request = msgspec.msgpack.encode(wire.WeightsRequest(actor_id="a", schema=1))
    assert reason(wire.decode_header, [request]) == "schema_version"


def test_a_demand_naming_who_covers_decodes_on_a_build_that_predates_the_names_and_an_older_one_names_none():
    class OldDemand(msgspec.Struct, tag="demand", kw_only=True):  # wire.Demand before `counts`
        schema: int = wire.SCHEMA_VERSION
        version: int
        groups_missing: int

    named = wire.Demand(version=4, groups_missing=3, counts={"actor-0": 2, "actor-2": 1})
    old = msgspec.msgpack.decode(wire.encode(named)[0], type=OldDemand)
    assert (old.version, old.groups_missing) == (4, 3)
    back = wire.decode_header(wire.encode(OldDemand(version=4, groups_missing=3)))
    assert back == wire.Demand(version=4, groups_missing=3) and back.counts is None
    assert wire.decode_header(wire.encode(named)).count_for("actor-2") == 1


def test_a_message_of_another_type_is_unexpected_type():
    shutdown = to_bytes(wire.encode(wire.Shutdown()))
    assert reason(decode_group, shutdown) == "unexpected_type"
    assert reason(decode_weights, shutdown) == "unexpected_type"
    assert reason(decode_weights, to_bytes(encode_group(make_group()))) == "unexpected_type"


@pytest.mark.parametrize("which", ["prompt", "tokens", "logprobs"])
def test_array_lengths_that_disagree_with_the_header_are_length_mismatch(which):
    short = {"prompt": np.array([3], np.int32), "tokens": np.array([5, 6], np.int32),
             "logprobs": np.array([-0.5, -1.0, -2.0, -1.0], np.float32)}
    assert reason(decode_group, group_frames(**{which: short[which]})) == "length_mismatch"


def test_a_frame_of_odd_byte_length_is_length_mismatch():
    frames = group_frames()
    frames[2] = frames[2][:-1]
    assert reason(decode_group, frames) == "length_mismatch"


def test_a_negative_token_count_is_length_mismatch():
    frames = group_frames(samples=[SampleInfo(4, 1.0, "stop"), SampleInfo(-1, 0.0, "stop")])
    assert reason(decode_group, frames) == "length_mismatch"


def decode_weights(frames):
    """One weights message decoded as a whole version."""
    return assembly.decode_weights([frames])


def test_weights_of_the_wrong_byte_size_are_length_mismatch():
    frames = to_bytes(chunks.encode_weights(0, {"w": torch.ones(4)})[0])
    assert reason(decode_weights, [frames[0], frames[1][:-4]]) == "length_mismatch"


def test_a_weights_chunk_with_a_flipped_bit_or_no_checksum_is_weights_checksum():
    frames = to_bytes(chunks.encode_weights(0, {"w": torch.arange(16.0)})[0])
    bad = bytearray(frames[1])
    bad[9] ^= 0x01
    assert reason(decode_weights, [frames[0], bytes(bad)]) == "weights_checksum"
    header = msgspec.structs.replace(wire.decode_header(frames), checksum=None)
    assert reason(decode_weights, [msgspec.msgpack.encode(header), frames[1]]) == "weights_checksum"
    assert decode_weights(frames)[1]["w"].tolist() == list(range(16))


def test_a_one_chunk_version_decodes_as_views_of_its_frame_without_a_copy():
    messages = chunks.encode_weights(3, {"a": torch.ones(3), "b": torch.arange(4, dtype=torch.int64)})
    assert len(messages) == 1 and len(messages[0]) == 2
    buf = bytearray(bytes(memoryview(messages[0][1])))
    _, back = decode_weights([messages[0][0], buf])
    buf[:4] = torch.tensor([5.0]).numpy().tobytes()
    assert back["a"].tolist() == [5.0, 1.0, 1.0] and back["b"].tolist() == [0, 1, 2, 3]


def _chunk(offsets=None, total=None, shapes=((3,), (2,)), dtype="float32", chunk_bytes=1 << 20, index=0,
           payload=None, version=0):
    """One hand-made weights chunk: tensors of `shapes`, at `offsets` in a `total`-byte version."""
    infos = [wire.TensorInfo(f"t{i}", dtype, list(s)) for i, s in enumerate(shapes)]
    offsets = [0, 16][:len(shapes)] if offsets is None else offsets
    total = 64 if total is None else total
    if payload is None:
        start = index * chunk_bytes
        payload = bytes(max(0, min(chunk_bytes, total - start)))
    header = wire.WeightsChunk(version=version, tensors=infos, offsets=offsets, total=total, chunk_bytes=chunk_bytes,
                               index=index, checksum=chunks.checksum([payload]))  # as a learner sends it
    return [msgspec.msgpack.encode(header), payload]


@pytest.mark.parametrize("offsets, total", [
    ([0, 8], 64),        # t1 starts inside t0 (which ends at 12)
    ([64, 0], 128),      # backwards
    ([0, 14], 64),       # not aligned to float32
    ([0, 64], 68),       # t1 ends past the version
    ([0, 1000], 2048),   # a gap no alignment explains
    ([0], 64),           # fewer offsets than tensors
    ([-4, 12], 64),      # before the version
], ids=["overlap", "backwards", "misaligned", "past_end", "gap", "count", "negative"])
def test_weights_with_impossible_offsets_are_bad_offset(offsets, total):
    assert reason(decode_weights, _chunk(offsets, total)) == "bad_offset"


def test_weights_with_bytes_no_tensor_accounts_for_are_length_mismatch():
    assert reason(decode_weights, _chunk([0, 16], 24 + 1024)) == "length_mismatch"
    decode_weights(_chunk([0, 16], 64))  # up to one cache line of alignment padding is fine


def test_a_weights_chunk_needs_its_bytes_in_two_to_two_per_tensor_plus_two_frames():
    frames = _chunk()  # two tensors
    assert reason(decode_weights, [*frames, *[b""] * 5]) == "frame_count"
    assert reason(decode_weights, frames[:1]) == "frame_count"
    assert reason(decode_weights, [*frames, b"x"]) == "length_mismatch"  # one byte more than its place holds
    decode_weights([frames[0], frames[1][:10], b"", frames[1][10:]])  # the same bytes in pieces are fine


def test_weights_of_an_unknown_dtype_are_bad_dtype():
    for dtype in ("float99", "Tensor", "nn"):
        assert reason(decode_weights, _chunk([0], 64, shapes=((1,),), dtype=dtype)) == "bad_dtype"


def test_weights_with_negative_shape_dims_are_a_wire_error():
    with pytest.raises(WireError):
        decode_weights(_chunk([0], 64, shapes=((-2, -2),)))


@pytest.mark.parametrize("changes", [dict(index=1), dict(index=-1), dict(chunk_bytes=0), dict(total=-64)],
                         ids=["index_past_count", "negative_index", "zero_chunk", "negative_total"])
def test_a_chunk_that_has_no_place_in_its_version_is_bad_chunk(changes):
    assert reason(decode_weights, _chunk(payload=b"", **changes)) == "bad_chunk"


def test_a_chunk_shorter_or_longer_than_its_place_is_length_mismatch():
    assert reason(decode_weights, _chunk(chunk_bytes=48, index=1, payload=bytes(8))) == "length_mismatch"
    assert reason(decode_weights, _chunk(chunk_bytes=48, index=0, payload=bytes(64))) == "length_mismatch"


def test_a_negative_weights_version_is_bad_version():
    assert reason(decode_weights, _chunk(version=-1)) == "bad_version"


def test_a_version_larger_than_the_subscriber_accepts_is_too_large():
    frames = _chunk(shapes=((10**6,),), offsets=[0], total=4 * 10**6, chunk_bytes=64)
    with pytest.raises(WireError) as e:
        assembly.decode_weights([frames], max_bytes=1 << 20)
    assert e.value.reason == "too_large"


def _messages(state, chunk_bytes=64, version=7):
    return [to_bytes(m) for m in chunks.encode_weights(version, state, chunk_bytes=chunk_bytes)]


def test_a_version_with_a_chunk_missing_is_never_delivered():
    state = {"w": torch.arange(64.0)}  # 256 bytes: 4 chunks of 64
    messages = _messages(state)
    for lost in range(4):
        assert reason(assembly.decode_weights, messages[:lost] + messages[lost + 1:]) == "chunk_lost"


def test_chunks_of_two_versions_never_mix():
    a, b = _messages({"w": torch.zeros(64)}, version=1), _messages({"w": torch.ones(64)}, version=2)
    assert reason(assembly.decode_weights, [a[0], b[1], a[2], a[3]]) == "chunk_lost"


def test_tensors_sent_in_place_arrive_as_views_of_their_frames_and_only_cut_ones_are_copied():
    g = torch.Generator().manual_seed(1)
    state = {"mid": torch.randn(40_000, generator=g), "norm": torch.randn(16, generator=g).to(torch.bfloat16),
             "big": torch.randn(100_000, generator=g), "ids": torch.arange(30_000, dtype=torch.int64)}
    messages = [to_bytes(m) for m in chunks.encode_weights(2, state, chunk_bytes=256 << 10, in_pieces=True)]
    assert any(len(m) > 2 for m in messages)  # pieces of several tensors in one chunk
    version, back = assembly.decode_weights(messages)
    assert version == 2 and all(torch.equal(back[k], t) for k, t in state.items())
    frames = [(np.frombuffer(f, dtype=np.uint8).ctypes.data, len(f)) for m in messages for f in m[1:] if len(f)]

    def in_a_frame(t):
        return any(a <= t.data_ptr() and t.data_ptr() + t.nbytes <= a + n for a, n in frames)

    assert in_a_frame(back["mid"]) and in_a_frame(back["norm"])  # inside one chunk: no copy
    assert not in_a_frame(back["big"])  # 400 KB over 256 KB chunks: put together from its pieces


def test_a_version_is_copied_into_a_models_tensors_piece_by_piece_without_a_version_sized_buffer():
    import tracemalloc

    g = torch.Generator().manual_seed(3)
    state = {"big": torch.randn(300_000, generator=g), "norm": torch.randn(16, generator=g).to(torch.bfloat16),
             "t": torch.randn(40, 30, generator=g).t()}  # big: 1.2 MB over 256 KB chunks, cut four times
    messages = [to_bytes(m) for m in chunks.encode_weights(5, state, chunk_bytes=256 << 10, in_pieces=True)]
    _, back = assembly.decode_weights(messages)
    model = {"big": torch.zeros(300_000), "norm": torch.zeros(16, dtype=torch.bfloat16),
             "t": torch.zeros(40, 30).t()}  # a destination that is not contiguous is filled too
    tracemalloc.start()
    back.copy_into(model)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert all(torch.equal(model[k], t) for k, t in state.items())
    assert peak < state["big"].nbytes // 4  # the cut tensor went straight from its frames, never whole first


@pytest.mark.parametrize("model", [{"v": torch.zeros(4)}, {"w": torch.zeros(4), "x": torch.zeros(1)},
                                   {"w": torch.zeros(2, 2)}, {"w": torch.zeros(4, dtype=torch.float64)}],
                         ids=["renamed", "one_more", "reshaped", "retyped"])
def test_a_version_is_not_copied_into_tensors_of_other_names_shapes_or_dtypes(model):
    _, back = assembly.decode_weights(_messages({"w": torch.ones(4)}))
    before = {k: t.clone() for k, t in model.items()}
    with pytest.raises(ValueError, match="weights:"):
        back.copy_into(model)
    assert all(torch.equal(model[k], t) for k, t in before.items())  # refused before anything was copied


def test_a_duplicate_chunk_is_refused_and_leaves_the_version_intact():
    state = {"w": torch.arange(64.0)}
    messages = _messages(state)
    assert reason(assembly.decode_weights, [messages[0], messages[1], messages[1], messages[2], messages[3]]) \
        == "duplicate_chunk"
    header = wire.decode_header(messages[1])
    version = assembly.Assembly(header, 1 << 20)
    for m in [messages[1], messages[0], messages[3], messages[2]]:
        h = wire.decode_header(m)
        version.add(h, chunks.chunk_payload(m, h))
    with pytest.raises(WireError, match="came twice"):
        version.add(header, chunks.chunk_payload(messages[1], header))
    assert torch.equal(version.tensors()["w"], state["w"])


def test_a_chunk_whose_layout_differs_from_its_versions_is_chunk_mismatch():
    a = _messages({"w": torch.zeros(64)})
    b = _messages({"v": torch.zeros(64)})  # same version and sizes, another tensor name
    assert reason(assembly.decode_weights, [a[0], b[1], a[2], a[3]]) == "chunk_mismatch"


def test_chunk_size_leaves_room_for_the_header_under_the_message_cap():
    assert chunks.chunk_bytes_for(4 << 20) == 3 << 20
    assert chunks.chunk_bytes_for(256 << 20) == chunks.DEFAULT_CHUNK_BYTES
    assert chunks.chunk_bytes_for(0) == chunks.DEFAULT_CHUNK_BYTES
    assert chunks.chunk_bytes_for(1000) % 64 == 0


# A header whose string value is not UTF-8 (map {"type": <str 0xff 0xfe>}), and one nested 50,000 maps deep.
NOT_UTF8 = b"\x81\xa4type\xa2\xff\xfe"
DEEP_MAPS = b"\x81\xa1a" * 50_000 + b"\x00"


def test_a_header_string_that_is_not_utf8_is_a_wire_error():
    with pytest.raises(WireError):
        wire.decode_header([NOT_UTF8])


def test_a_deeply_nested_header_is_a_wire_error():
    with pytest.raises(WireError):
        wire.decode_header([DEEP_MAPS])


def test_an_actor_id_that_is_valid_utf8_round_trips():
    g = make_group(actor_id="akteur-\u00fc-\u6f22")
    assert decode_group(to_bytes(encode_group(g))).actor_id == "akteur-\u00fc-\u6f22"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_reward_is_non_finite_reward(bad):
    frames = group_frames(samples=[SampleInfo(2, 1.0, "stop"), SampleInfo(1, bad, "stop")])
    assert reason(decode_group, frames) == "non_finite_reward"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_logprob_is_non_finite_logprob(bad):
    frames = group_frames(logprobs=np.array([-0.5, bad, -2.0], np.float32))
    assert reason(decode_group, frames) == "non_finite_logprob"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("at", [0, 1, 4_095, 77_777, 99_999])
def test_a_non_finite_logprob_anywhere_in_a_long_array_is_non_finite_logprob(bad, at):
    n = 100_000  # long enough for vectorised reductions to split it into lanes and blocks
    logprobs = np.full(n, -0.5, np.float32)
    logprobs[at] = bad
    frames = group_frames(samples=[SampleInfo(n, 1.0, "length")], tokens=np.zeros(n, np.int32), logprobs=logprobs)
    assert reason(decode_group, frames) == "non_finite_logprob"


def test_a_positive_logprob_is_bad_logprob():
    frames = group_frames(logprobs=np.array([-0.5, 0.5, -2.0], np.float32))
    assert reason(decode_group, frames) == "bad_logprob"


def test_a_logprob_of_zero_is_accepted():
    g = decode_group(group_frames(logprobs=np.array([0.0, -0.0, -2.0], np.float32)))
    assert g.behaviour_logprobs.tolist() == [0.0, 0.0, -2.0]


@pytest.mark.parametrize("where,bad", [("prompt", VOCAB), ("prompt", -1), ("tokens", VOCAB), ("tokens", -5),
                                       ("tokens", 2**31 - 1)])
def test_a_token_id_outside_the_vocabulary_is_token_out_of_range(where, bad):
    arrays = {"prompt": np.array([3, 4], np.int32), "tokens": np.array([5, 6, 7], np.int32)}
    arrays[where][-1] = bad
    assert reason(decode_group, group_frames(**arrays), vocab_size=VOCAB) == "token_out_of_range"


def test_the_largest_valid_token_id_is_accepted():
    g = decode_group(group_frames(tokens=np.array([0, 6, VOCAB - 1], np.int32)), vocab_size=VOCAB)
    assert g.completion_tokens.tolist() == [0, 6, VOCAB - 1]


def test_a_negative_policy_version_is_bad_version():
    assert reason(decode_group, group_frames(policy_version=-1)) == "bad_version"


def test_a_group_without_samples_is_empty_group():
    assert reason(decode_group, group_frames(samples=[], tokens=np.zeros(0, np.int32),
                                                  logprobs=np.zeros(0, np.float32))) == "empty_group"


def test_a_group_with_an_empty_prompt_is_rejected():
    with pytest.raises(WireError):
        decode_group(group_frames(num_prompt_tokens=0, prompt=np.zeros(0, np.int32)), vocab_size=VOCAB)


def test_wire_error_carries_reason_and_detail():
    e = WireError("bad_version", "policy_version -1 < 0")
    assert e.reason == "bad_version" and e.detail == "policy_version -1 < 0"
    assert str(e) == "bad_version: policy_version -1 < 0"
    assert isinstance(e, ValueError)


# --- no pickle anywhere ----------------------------------------------------------------------


def pickle_uses(source: str) -> list[str]:
    """Code (not comments or docstrings) that could unpickle: pickle names, *_pyobj, torch.load without
    weights_only=True."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME and ("pickle" in tok.string.lower() or tok.string in ("recv_pyobj", "send_pyobj")):
            found.append(f"line {tok.start[0]}: {tok.string}")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch":
            safe = any(k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                       for k in node.keywords)
            if not safe:
                found.append(f"line {node.lineno}: torch.load without weights_only=True")
    return found


def test_the_pickle_detector_finds_what_it_looks_for():
    assert pickle_uses("import pickle\n")
    assert pickle_uses("import cloudpickle as cp\n")
    assert pickle_uses("x = sock.recv_pyobj()\n")
    assert pickle_uses("np.load(f, allow_pickle=True)\n")
    assert pickle_uses("import torch\ntorch.load(f)\n")
    assert pickle_uses("import torch\ntorch.load(f, weights_only=False)\n")
    assert not pickle_uses("import torch\ntorch.load(f, weights_only=True)\n")
    assert not pickle_uses('"""Nothing here ever unpickles."""\n# no pickle\n')


def test_no_module_under_streamrl_actors_or_learner_uses_pickle():
    files = [p for d in ("streamrl", "actors", "learner") for p in sorted((REPO / d).rglob("*.py"))]
    assert len(files) >= 10
    offenders = {str(p.relative_to(REPO)): hits for p in files if (hits := pickle_uses(p.read_text()))}
    assert offenders == {}


def test_layer_and_corrections_survive_single_and_batch_messages():
    from streamrl.comm import codec, turn_spans, wire

    def group(layer, corr):
        return codec.ScoredGroup.from_samples(prompt_id="p", policy_version=1, actor_id="a", prompt_tokens=[1, 2],
                                             completions=[[3], [4, 5]], logprobs=[[-0.1], [-0.2, -0.3]],
                                             rewards=[1.0, 0.0], finish_reasons=["stop", "length"],
                                             corrections=corr, layer=layer)

    def raw(frames):  # as they arrive from a socket
        return [f if isinstance(f, bytes) else f.tobytes() for f in frames]

    one = decode_group(raw(encode_group(group(2, None))))
    assert one.layer == 2 and one.corrections is None
    both = codec.decode_groups(raw(codec.encode_groups([group(1, [0.5, 1.0]), group(2, None)])))
    assert [(g.layer, g.corrections) for g in both] == [(1, [0.5, 1.0]), (2, None)]
    bad = group(1, [0.5, 1.0])
    bad.samples[1] = wire.SampleInfo(num_tokens=2, reward=0.0, finish_reason="length")
    with pytest.raises(wire.WireError, match="partial_corrections"):
        codec.decode_groups(raw(codec.encode_groups([bad, group(1, None)])))


# --- model-token masks (multi-turn episodes) -------------------------------------------------


def masked_group(masks=None, **kw) -> codec.ScoredGroup:
    """make_group's samples, with tokens 2 of sample 0 and 0 of sample 3 the environment's by default."""
    if masks is None:
        masks = [np.array([True, True, False]), np.array([True]), np.zeros(0, bool), np.array([False, True])]
    return make_group(model_token_masks=masks, **kw)


def test_model_token_masks_round_trip_in_single_and_batch_messages_and_logprobs_under_them_travel_as_zero():
    g = masked_group()
    assert g.behaviour_logprobs.tolist() == [-0.5, -1.25, 0.0, -2.0, 0.0, -3.5]  # the environment's were -0.125, -0.0
    frames = encode_group(g)
    assert len(frames) == 5 and np.shares_memory(frames[4], g.model_token_mask)
    back = decode_group(to_bytes(frames), vocab_size=VOCAB)
    assert back.model_token_mask.dtype == np.bool_
    assert back.model_token_mask.tolist() == [True, True, False, True, False, True]
    assert back.sample_model_mask(0).tolist() == [True, True, False] and back.sample_model_mask(2).tolist() == []
    assert np.array_equal(back.behaviour_logprobs, g.behaviour_logprobs)
    plain = make_group(prompt_id="plain")
    both = codec.decode_groups(to_bytes(codec.encode_groups([plain, g, plain])), vocab_size=VOCAB)
    assert [b.model_token_mask.tolist() for b in both] == [[True] * 6, g.model_token_mask.tolist(), [True] * 6]
    assert [b.prompt_id for b in both] == ["plain", "copy-abca", "plain"]


def test_without_environment_tokens_a_group_travels_exactly_as_before_masks_existed():
    plain = make_group()
    all_model = masked_group([np.ones(n, bool) for n in (3, 1, 0, 2)])
    assert plain.model_token_mask is None and all_model.model_token_mask.all()
    a, b = to_bytes(encode_group(plain)), to_bytes(encode_group(all_model))
    assert len(a) == 4 and a[1:] == b[1:] and len(a[0]) == len(b[0])  # no fifth frame, no header byte more
    assert len(to_bytes(codec.encode_groups([plain, all_model]))) == 4
    assert codec.group_nbytes(plain) == codec.group_nbytes(all_model)
    assert decode_group(a).model_token_mask is None and decode_group(b).model_token_mask is None
    assert plain.sample_model_mask(0).tolist() == [True, True, True]


@pytest.mark.parametrize("masks, match", [
    ([np.array([True, True])] + [np.ones(n, bool) for n in (1, 0, 2)], "bool array of the completion's 3 tokens"),
    ([np.array([1, 1, 0])] + [np.ones(n, bool) for n in (1, 0, 2)], "bool array"),
    ([np.ones(n, bool) for n in (3, 1, 0)], "3 masks for 4 completions"),
    ([np.ones(3, bool), np.zeros(1, bool), np.zeros(0, bool), np.ones(2, bool)], "none of the completion's 1 tokens"),
], ids=["short", "not_bool", "count", "no_model_token"])
def test_making_a_group_with_a_mask_that_does_not_fit_its_completion_says_which_and_why(masks, match):
    with pytest.raises(ValueError, match=match):
        masked_group(masks)


def masked_frames(mask: bytes) -> list[bytes]:
    """group_frames' group (samples of 2 and 1 tokens) with `mask` as its fifth frame."""
    return [*group_frames(), mask]


def test_a_mask_frame_decodes_and_the_learner_sees_which_tokens_are_the_models():
    assert decode_group(masked_frames(bytes([1, 0, 1]))).model_token_mask.tolist() == [True, False, True]


@pytest.mark.parametrize("mask, why, match", [
    (bytes([1, 0]), "length_mismatch", "model-token mask: 2 bytes, header says 3"),
    (bytes([1, 0, 1, 1]), "length_mismatch", "model-token mask: 4 bytes"),
    (bytes([1, 2, 1]), "bad_mask", "byte 1 is 2; allowed 0 .environment. or 1 .model."),
    (bytes([0, 0, 1]), "no_model_tokens", "sample 0: all 2 of its tokens are marked as environment tokens"),
    (bytes([1, 1, 0]), "no_model_tokens", "sample 1: all 1 of its tokens"),
], ids=["short", "long", "not_0_or_1", "first_sample_all_environment", "last_sample_all_environment"])
def test_a_bad_mask_is_rejected_with_a_reason_that_says_what_is_wrong(mask, why, match):
    with pytest.raises(WireError, match=match) as e:
        decode_group(masked_frames(mask))
    assert e.value.reason == why


def test_masks_may_be_lists_of_bools_as_an_episode_collects_them():
    g = masked_group([[True, True, False], [True], [], [False, True]])
    assert g.model_token_mask.tolist() == [True, True, False, True, False, True]


def test_an_empty_sample_needs_no_model_token_and_a_batch_mask_is_split_per_group():
    g = masked_group()  # sample 2 has no tokens at all: allowed with a mask as without
    batch = codec.decode_groups(to_bytes(codec.encode_groups([g, g])), vocab_size=VOCAB)
    assert [b.model_token_mask.tolist() for b in batch] == [g.model_token_mask.tolist()] * 2
    frames = to_bytes(codec.encode_groups([g, make_group()]))
    frames[4] = frames[4][:6] + bytes([0, 0, 0, 0, 0, 0])  # the plain group's tokens all environment now
    assert reason(codec.decode_groups, frames) == "no_model_tokens"


def test_make_is_the_name_multi_turn_episodes_build_groups_by():
    g = codec.ScoredGroup.make(prompt_id="p", policy_version=0, actor_id="a", prompt_tokens=[1], completions=[[2, 3]],
                              logprobs=[[-1.0, -9.0]], rewards=[1.0], finish_reasons=["stop"],
                              model_token_masks=[np.array([True, False])])
    assert g.model_token_mask.tolist() == [True, False] and g.behaviour_logprobs.tolist() == [-1.0, 0.0]


def test_a_sample_left_unscored_travels_as_such_and_one_from_before_the_flag_decodes_as_scored():
    g = decode_group(to_bytes(encode_group(make_group(scored=[True, False, True, False]))))
    assert g.scored == [True, False, True, False] and g.rewards == [1.0, 0.25, 0.0, 0.5]
    old = msgspec.msgpack.encode([2, 1.0, "stop"])  # a SampleInfo as actors sent it before the flag
    assert msgspec.msgpack.decode(old, type=SampleInfo).scored is True
    assert decode_group(to_bytes(encode_group(make_group()))).scored == [True] * 4


def test_an_episodes_turns_travel_as_roles_and_token_counts_and_turns_that_do_not_fit_its_tokens_are_refused():
    T = turn_spans.TurnSpan
    spans = [[T("model", 2), T("tool", 1, ("lookup",))], [T("model", 1)], [], [T("model", 1), T("environment", 1)]]
    g = decode_group(to_bytes(encode_group(make_group(spans=spans))))
    assert [g.sample_turns(i) for i in range(4)] == spans and g.samples[0].turn_layout == [0, 2, 2, 1]
    assert decode_group(to_bytes(encode_group(make_group()))).sample_turns(0) is None  # a single-turn sample
    frames = to_bytes(encode_group(make_group(spans=spans)))
    header = msgspec.msgpack.decode(frames[0])
    for layout, tools, why in (([0, 2, 2, 2], None, "hold 4 tokens, its completion 3"),
                               ([7, 2, 2, 1], None, "need \\[role code 0-2, tokens\\] pairs"),
                               ([0, 2, 2], None, "pairs"), ([0, 2, 0, 1], [["lookup"]], "1 tool turns' tools for 0")):
        header["groups"][0][3][0][9:11] = [layout, tools]
        frames[0] = msgspec.msgpack.encode(header)
        g = decode_group(frames)  # training never reads them: the group is received ...
        with pytest.raises(ValueError, match=why):  # ... and its turns refused where they are used
            g.sample_turns(0)
    header["groups"][0][3][0][9] = [0, -3, 2, 1]
    frames[0] = msgspec.msgpack.encode(header)
    assert reason(codec.decode_groups, frames) == "bad_header"  # a negative count is not even a layout
