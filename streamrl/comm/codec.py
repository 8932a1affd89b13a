"""Scored groups on the wire: `ScoredGroup`, and its frames (`encode_groups`, `decode_groups`).

A group batch is [GroupBatchHeader, prompt tokens, completion tokens, log-probs, (model-token mask)]:
one header and one frame per array for any number of groups, so the fixed cost of a message and of
checking its arrays is paid once per batch rather than once per group; a single group keeps its
arrays zero-copy, and received arrays are numpy views on the frames.

A completion may hold environment tokens (a multi-turn episode: tool results, the template's turn
markers) between the model's own: a group then carries a model-token mask, one more frame, and the
learner trains on the tokens the model sampled alone. A batch without environment tokens sends no
mask frame and pays nothing for the feature.
"""

from __future__ import annotations

import math
import time
from itertools import accumulate
from typing import Sequence

import msgspec
import numpy as np
from msgspec import Struct

from streamrl.comm import turn_spans
from streamrl.comm.wire import (LOGPROB_DTYPE, MASK_DTYPE, TOKEN_DTYPE, FilteredCensus, GroupBatchHeader, GroupEntry,
                                SampleInfo, WireError, buffer, decode_header, encode)


class ScoredGroup(Struct, kw_only=True):
    """One prompt's G scored samples, as actors build them and the learner consumes them.

    Arrays are flat: sample i's completion is `completion_tokens[offsets[i]:offsets[i+1]]`.
    Shapes: prompt_tokens (P,), completion_tokens (sum T_i,), behaviour_logprobs (sum T_i,),
    model_token_mask (sum T_i,) or None. A completion is every token after the prompt; in a
    multi-turn episode that interleaves the model's turns with the environment's.
    """

    prompt_id: str
    policy_version: int
    actor_id: str
    prompt_tokens: np.ndarray
    completion_tokens: np.ndarray
    behaviour_logprobs: np.ndarray
    samples: list[SampleInfo]
    created_at: float = msgspec.field(default_factory=time.time)
    sent_at: float = 0.0
    session: str = ""
    """Which life of the actor sent it (set by GroupSender); with seq, the learner's accounting key."""
    seq: int = -1
    """0, 1, 2, … per session, in send order (-1: not sent through a GroupSender)."""
    layer: int = 1
    """1: a prompt's group; 2: a multi-layer GRPO correction group."""
    filtered: FilteredCensus | None = None
    """Groups the actor's dynamic filter dropped since its previous group (see FilteredCensus); None: none."""
    reward_failures: dict[str, int] | None = None
    """Samples the actor's reward functions left unscored since its previous group, by reason; None: none."""
    episode_counts: dict[str, int] | None = None
    """Multi-turn episodes' counts since its previous group (wire.GroupEntry.episode_counts); None: none."""
    model_token_mask: np.ndarray | None = None
    """(sum T_i,) bool, True where the model sampled the completion token, False under an environment token
    (its behaviour log-prob is meaningless and ignored); None: every token is the model's."""

    @property
    def group_size(self) -> int:
        return len(self.samples)

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]

    @property
    def scored(self) -> list[bool]:
        """Which samples' rewards are scores (False: it stands in for one a user's function failed to give)."""
        return [s.scored for s in self.samples]

    @property
    def last_versions(self) -> list[int]:
        """The newest policy version behind each sample (policy_version where no in-flight update hit it)."""
        return [self.policy_version if s.last_version is None else s.last_version for s in self.samples]

    @property
    def corrections(self) -> list[float] | None:
        """Layer-1 groups under multi-layer GRPO: each sample's correction reward; None otherwise."""
        if self.samples and self.samples[0].correction is not None:
            return [s.correction for s in self.samples]
        return None

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([s.num_tokens for s in self.samples])]).astype(np.int64)

    def sample_tokens(self, i: int) -> np.ndarray:
        o = self.offsets
        return self.completion_tokens[o[i] : o[i + 1]]

    def sample_turns(self, i: int) -> list[turn_spans.TurnSpan] | None:
        """Sample i's turns in order (None: a single-turn sample); ValueError when they do not fit it (checked where
        used, not on every group received: training never reads them)."""
        s = self.samples[i]
        return None if s.turn_layout is None else turn_spans.unpack(s.turn_layout, s.turn_tools, s.num_tokens)

    def sample_logprobs(self, i: int) -> np.ndarray:
        o = self.offsets
        return self.behaviour_logprobs[o[i] : o[i + 1]]

    def sample_model_mask(self, i: int) -> np.ndarray:
        """(T_i,) bool: which of sample i's tokens the model sampled (all of them without a mask)."""
        o = self.offsets
        if self.model_token_mask is None:
            return np.ones(o[i + 1] - o[i], dtype=bool)
        return self.model_token_mask[o[i] : o[i + 1]]

    @classmethod
    def from_samples(
        cls,
        *,
        prompt_id: str,
        policy_version: int,
        actor_id: str,
        prompt_tokens: Sequence[int],
        completions: Sequence[Sequence[int]],
        logprobs: Sequence[Sequence[float]],
        rewards: Sequence[float],
        finish_reasons: Sequence[str],
        corrections: Sequence[float] | None = None,
        layer: int = 1,
        last_versions: Sequence[int | None] | None = None,
        model_token_masks: Sequence[np.ndarray] | None = None,
        scored: Sequence[bool] | None = None,
        parts: Sequence[list | None] | None = None,
        turns: Sequence[int] | None = None,
        tool_calls: Sequence[dict[str, int]] | None = None,
        spans: Sequence[list[turn_spans.TurnSpan]] | None = None,
    ) -> "ScoredGroup":
        """last_versions[i]: the newest version that sampled sample i (in-flight updates); kept only when
        newer than policy_version, which stays the oldest and is what the staleness gate judges.

        model_token_masks[i]: (T_i,) bool aligned with completions[i], True where the model sampled the
        token, False under an environment token; None: all the model's. logprobs stay aligned with
        every token; entries under environment tokens are ignored (sent as 0). A group whose masks are
        all True travels as one without masks (and arrives with model_token_mask None).

        scored[i]: False where sample i's reward stands in for a score it did not get (a reward function or
        environment failed on it); None: every sample scored. parts[i], turns[i], tool_calls[i], spans[i]: sample
        i's reward functions' values, an episode's model turns, tool calls, turns in order (the samples log's)."""
        last = [v if v is not None and v > policy_version else None
                for v in (last_versions or [None] * len(completions))]
        logprob_array = np.concatenate([np.asarray(lp, dtype=LOGPROB_DTYPE) for lp in logprobs])
        mask = _model_mask(completions, model_token_masks)
        if mask is not None:
            logprob_array[~mask] = 0.0  # a sampler's log-prob of a token it did not sample means nothing
        return cls(
            prompt_id=prompt_id,
            policy_version=policy_version,
            actor_id=actor_id,
            prompt_tokens=np.asarray(prompt_tokens, dtype=TOKEN_DTYPE),
            completion_tokens=np.concatenate([np.asarray(c, dtype=TOKEN_DTYPE) for c in completions]),
            behaviour_logprobs=logprob_array,
            samples=[
                SampleInfo(num_tokens=len(c), reward=float(r), finish_reason=f,  # type: ignore[arg-type]
                           correction=None if corrections is None else float(corrections[i]), last_version=last[i],
                           scored=True if scored is None else bool(scored[i]),
                           parts=None if parts is None or parts[i] is None else [_part(v) for v in parts[i]],
                           turns=None if turns is None else int(turns[i]),
                           tool_calls=None if tool_calls is None else dict(tool_calls[i]),
                           **({} if spans is None else turn_spans.pack(spans[i])))
                for i, (c, r, f) in enumerate(zip(completions, rewards, finish_reasons))
            ],
            layer=layer,
            model_token_mask=mask,
        )

    make = from_samples  # the name issue 26's multi-turn episodes build groups by


def _part(v) -> float | None:
    """A reward function's value as the wire takes it: a finite float, or None (not applicable, failed, not a
    finite number)."""
    try:
        v = None if v is None else float(v)
    except (TypeError, ValueError):
        return None
    return v if v is not None and math.isfinite(v) else None


def _model_mask(completions: Sequence[Sequence[int]], masks: Sequence[np.ndarray] | None) -> np.ndarray | None:
    """One flat (sum T_i,) bool mask from per-completion ones, checked; None when there are none."""
    if masks is None:
        return None
    if len(masks) != len(completions):
        raise ValueError(f"model_token_masks: {len(masks)} masks for {len(completions)} completions")
    flat = []
    for i, (c, m) in enumerate(zip(completions, masks)):
        m = np.asarray(m) if len(m) else np.zeros(0, dtype=bool)  # an empty list is float64 to numpy
        if m.dtype != np.bool_ or m.shape != (len(c),):
            raise ValueError(f"model_token_masks[{i}]: need a bool array of the completion's {len(c)} tokens, got "
                             f"{m.dtype} of shape {m.shape}")
        if len(c) and not m.any():
            raise ValueError(f"model_token_masks[{i}]: none of the completion's {len(c)} tokens is the model's")
        flat.append(m)
    return np.concatenate(flat) if flat else np.zeros(0, dtype=bool)


def encode_groups(groups: Sequence[ScoredGroup]) -> list:
    """Frames for one or more groups of one actor session: [GroupBatchHeader, prompt tokens, completion
    tokens, log-probs, and the model-token mask if some group has one]. A single group's frames are its own
    arrays (no copy); several groups' arrays are concatenated (one copy, into fresh arrays)."""
    first = groups[0]
    if any(g.actor_id != first.actor_id or g.session != first.session for g in groups):
        raise ValueError("a group batch carries the groups of one actor session")
    header = GroupBatchHeader(
        actor_id=first.actor_id,
        session=first.session,
        sent_at=time.time(),
        groups=[GroupEntry(g.prompt_id, g.policy_version, int(g.prompt_tokens.size), g.samples, g.created_at, g.seq,
                           g.layer, g.filtered, g.reward_failures, g.episode_counts) for g in groups],
    )
    if len(groups) == 1:
        arrays = [np.ascontiguousarray(getattr(first, name), dtype=dtype) for name, dtype in _ARRAYS]
        if _has_environment_tokens(first):
            arrays.append(first.model_token_mask.view(MASK_DTYPE))
    else:
        arrays = [np.concatenate([getattr(g, name) for g in groups], dtype=dtype) for name, dtype in _ARRAYS]
        if any(g.model_token_mask is not None and not g.model_token_mask.all() for g in groups):
            arrays.append(np.concatenate([g.model_token_mask if g.model_token_mask is not None
                                          else np.ones(g.completion_tokens.size, bool) for g in groups]).view(MASK_DTYPE))
    return [*encode(header), *arrays]


def _has_environment_tokens(group: ScoredGroup) -> bool:
    return group.model_token_mask is not None and not group.model_token_mask.all()


_ARRAYS = (("prompt_tokens", TOKEN_DTYPE), ("completion_tokens", TOKEN_DTYPE), ("behaviour_logprobs", LOGPROB_DTYPE))


def group_nbytes(group: ScoredGroup) -> int:
    """Bytes of a group's bulk arrays (what it adds to a message, headers aside)."""
    return (group.prompt_tokens.nbytes + group.completion_tokens.nbytes + group.behaviour_logprobs.nbytes
            + (group.model_token_mask.nbytes if _has_environment_tokens(group) else 0))


def decode_groups(frames: Sequence, header: GroupBatchHeader | None = None,
                  vocab_size: int | None = None) -> list[ScoredGroup]:
    """Rebuild and validate every group of a group message; arrays are views on the frames. One bad
    group rejects the whole message."""
    if header is None:
        header = decode_header(frames)
    if not isinstance(header, GroupBatchHeader):
        raise WireError("unexpected_type", f"expected a scored_group_batch, got {type(header).__name__}")
    if len(frames) not in (4, 5):
        raise WireError("frame_count", f"scored_group_batch needs 4 frames (5 with a model-token mask), got "
                        f"{len(frames)}")
    entries = header.groups
    if not entries:
        raise WireError("empty_batch", "scored_group_batch has no groups")
    token_starts = _check_groups(entries)
    prompt_starts = list(accumulate((e.num_prompt_tokens for e in entries), initial=0))
    prompt, tokens, logprobs = _check_arrays(frames, prompt_starts[-1], token_starts[-1], vocab_size)
    mask = _check_mask(frames[4], entries, token_starts[-1]) if len(frames) == 5 else None
    actor, sent_at, session = header.actor_id, header.sent_at, header.session
    groups = [
        ScoredGroup(prompt_id=e.prompt_id, policy_version=e.policy_version, actor_id=actor, samples=e.samples,
                    prompt_tokens=prompt[p0:p1], completion_tokens=tokens[t0:t1], behaviour_logprobs=logprobs[t0:t1],
                    created_at=e.created_at, sent_at=sent_at, session=session, seq=e.seq, layer=e.layer,
                    filtered=e.filtered, reward_failures=e.reward_failures, episode_counts=e.episode_counts)
        for e, p0, p1, t0, t1 in zip(entries, prompt_starts, prompt_starts[1:], token_starts, token_starts[1:])
    ]
    if mask is not None:  # set afterwards: the usual groups without one pay nothing per group
        for g, t0, t1 in zip(groups, token_starts, token_starts[1:]):
            g.model_token_mask = mask[t0:t1]
    return groups


def check_rewards(groups: Sequence[ScoredGroup], reward_range: tuple[float, float] | None) -> None:
    """Every sample's reward (and correction reward) within the run's shaped scale [low, high]; a peer that sends
    1e30 would otherwise train the learner on it. reward_range None: no bound."""
    if reward_range is None:
        return
    low, high = reward_range
    slack = 1e-6 * max(1.0, high - low)  # shaping's float arithmetic, not a wider scale
    values = [r for g in groups for s in g.samples for r in (s.reward, s.correction) if r is not None]
    if low - slack <= min(values) and max(values) <= high + slack:
        return
    for gi, g in enumerate(groups):
        for i, s in enumerate(g.samples):
            for what, r in (("reward", s.reward), ("correction reward", s.correction)):
                if r is not None and not low - slack <= r <= high + slack:
                    raise WireError("reward_out_of_range", f"group {gi} sample {i}: {what} {r} is outside the run's "
                                    f"reward scale [{low}, {high}]")


def _check_groups(groups: Sequence[GroupEntry]) -> list[int]:
    """The header checks of every group at once (a few C-level passes instead of a Python loop per
    sample). Returns where each group's completion tokens start, then the total: (num_groups + 1,)."""
    def first(bad, what: str, reason: str):
        i = next(i for i, g in enumerate(groups) if bad(g))
        raise WireError(reason, f"group {i}: {what(groups[i])}")

    if min(g.policy_version for g in groups) < 0:
        first(lambda g: g.policy_version < 0, lambda g: f"policy_version {g.policy_version} < 0", "bad_version")
    if min(g.seq for g in groups) < -1:
        first(lambda g: g.seq < -1, lambda g: f"seq {g.seq} < 0", "bad_seq")
    if not all(g.layer in (1, 2) for g in groups):
        first(lambda g: g.layer not in (1, 2),
              lambda g: f"layer {g.layer}: must be 1 (prompt group) or 2 (correction group)", "bad_layer")
    if any(g.filtered is not None and min(msgspec.structs.astuple(g.filtered)) < 0 for g in groups):
        first(lambda g: g.filtered is not None and min(msgspec.structs.astuple(g.filtered)) < 0,
              lambda g: f"filtered {msgspec.structs.astuple(g.filtered)}: counts must be >= 0", "bad_filtered")
    if min(g.num_prompt_tokens for g in groups) < 1:
        first(lambda g: g.num_prompt_tokens < 1,
              lambda g: f"num_prompt_tokens is {g.num_prompt_tokens}; a prompt needs ≥ 1 token", "empty_prompt")
    sizes = [len(g.samples) for g in groups]
    if min(sizes) == 0:
        first(lambda g: not g.samples, lambda g: "scored_group has no samples", "empty_group")
    samples = [s for g in groups for s in g.samples]
    counts = [s.num_tokens for s in samples]
    if min(counts) < 0:
        i = next(i for i, n in enumerate(counts) if n < 0)
        raise WireError("length_mismatch", f"sample {i} has num_tokens {counts[i]} < 0")
    rewards = [s.reward for s in samples]
    # A sum is non-finite if some reward is (or if finite ones overflow: then look closer).
    if not math.isfinite(sum(rewards)) and not all(map(math.isfinite, rewards)):
        i = next(i for i, r in enumerate(rewards) if not math.isfinite(r))
        raise WireError("non_finite_reward", f"sample {i} reward is {rewards[i]}")
    corrections = [s.correction for s in samples]
    if corrections.count(None) != len(corrections):  # multi-layer GRPO groups only pay for these checks
        for gi, g in enumerate(groups):
            if len({s.correction is None for s in g.samples}) > 1:
                raise WireError("partial_corrections", f"group {gi}: corrections must be given for all samples or none")
        if not all(math.isfinite(c) for c in corrections if c is not None):
            i = next(i for i, c in enumerate(corrections) if c is not None and not math.isfinite(c))
            raise WireError("non_finite_reward", f"sample {i} correction reward is {corrections[i]}")
    if any(s.last_version is not None for s in samples):  # in-flight updates only pay for this check
        for gi, g in enumerate(groups):
            bad = [v for s in g.samples if (v := s.last_version) is not None and v < g.policy_version]
            if bad:
                raise WireError("bad_version_span", f"group {gi}: a sample's last_version {bad[0]} is older than the "
                                f"group's policy_version {g.policy_version}")
    token_starts = list(accumulate(counts, initial=0))
    return [token_starts[i] for i in accumulate(sizes, initial=0)]


def _check_arrays(frames: Sequence, num_prompt: int, num_tokens: int, vocab_size: int | None):
    """Frames 1..3 as (prompt tokens, completion tokens, log-probs) views, checked in one pass each."""
    prompt = _array(frames[1], TOKEN_DTYPE, num_prompt, "prompt tokens")
    tokens = _array(frames[2], TOKEN_DTYPE, num_tokens, "completion tokens")
    logprobs = _array(frames[3], LOGPROB_DTYPE, num_tokens, "behaviour log-probs")
    if logprobs.size:
        # max and min are SIMD passes in float32 (a float64 sum, which would catch NaN and ±inf alone,
        # costs ~9× one of them); a NaN propagates into max, +inf shows in max, -inf in min.
        high, low = float(logprobs.max()), float(logprobs.min())
        if not (math.isfinite(high) and math.isfinite(low)):
            raise WireError("non_finite_logprob", "behaviour log-probs contain NaN or inf")
        if high > 1e-4:
            raise WireError("bad_logprob", f"behaviour log-prob {high} > 0")
    if vocab_size is not None:
        for name, arr in (("prompt", prompt), ("completion", tokens)):
            # Viewed as unsigned, a negative id is huge, so one max() checks both ends.
            if arr.size and arr.view(np.uint32).max() >= vocab_size:
                raise WireError(
                    "token_out_of_range",
                    f"{name} token ids span [{arr.min()}, {arr.max()}], vocabulary is [0, {vocab_size})",
                )
    return prompt, tokens, logprobs


def _check_mask(frame, groups: Sequence[GroupEntry], num_tokens: int) -> np.ndarray:
    """Frame 4 as a (num_tokens,) bool view: one 0/1 byte per completion token, and every sample with
    tokens has at least one of the model's (a sample the model took no part in is nothing to learn from)."""
    raw = _array(frame, MASK_DTYPE, num_tokens, "model-token mask")
    if not raw.size:
        return raw.view(bool)
    lengths = [s.num_tokens for g in groups for s in g.samples]
    nonempty = [i for i, n in enumerate(lengths) if n]
    starts = list(accumulate(lengths, initial=0))
    # One pass for both checks: each non-empty sample's largest byte (their segments tile the frame, empty
    # samples having none); a cumulative sum's int64 widening costs ~100× more at 128k tokens.
    peak = np.maximum.reduceat(raw, [starts[i] for i in nonempty])
    if not peak.min() == 1 == peak.max():
        if peak.max() > 1:
            i = int(np.argmax(raw > 1))
            raise WireError("bad_mask", f"model-token mask byte {i} is {raw[i]}; allowed 0 (environment) or 1 (model)")
        i = nonempty[int(np.argmin(peak))]
        raise WireError("no_model_tokens", f"sample {i}: all {lengths[i]} of its tokens are marked as environment "
                        "tokens; a sample needs at least one token the model sampled")
    return raw.view(bool)


def _array(frame, dtype, count: int, what: str) -> np.ndarray:
    buf = buffer(frame)
    itemsize = np.dtype(dtype).itemsize
    if len(buf) != count * itemsize:
        raise WireError("length_mismatch", f"{what}: {len(buf)} bytes, header says {count} × {itemsize}")
    return np.frombuffer(buf, dtype=dtype)
