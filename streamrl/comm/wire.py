"""Messages that cross a socket: msgspec Structs with a type tag and a schema version.

A message is a list of ZeroMQ frames: frame 0 is the msgspec-encoded header, and bulk arrays
follow as separate frames so they travel without copies (numpy/torch views on the received
buffers). Scored groups have one format, a batch (GroupBatchHeader; a single group is a batch of
one and keeps its arrays zero-copy), so the fixed cost of a message and of checking its arrays is
paid once per batch rather than once per group. Weights have one layout: a version is one flat
byte buffer (every tensor at an aligned offset) that travels as chunks under the message cap
(WeightsChunk; see streamrl.comm.chunks for the two ends).

A completion may hold environment tokens (a multi-turn episode: tool results, the template's turn
markers) between the model's own: a group then carries a model-token mask, one more frame, and the
learner trains on the tokens the model sampled alone. A batch without environment tokens sends no
mask frame and pays nothing for the feature.

Nothing here ever unpickles: decoding is msgspec plus explicit checks, and every failure is a
`WireError` with a short `reason` label that receivers count by.
"""

from __future__ import annotations

import math
import time
from itertools import accumulate
from typing import Annotated, Any, Literal, Sequence, Union

import msgspec
import numpy as np
from msgspec import Meta, Struct

# 2: scored groups may carry a model-token mask (a fifth frame). A peer of another version is refused,
# message by message (`schema_version`, naming both versions): the two ends must agree on every frame.
SCHEMA_VERSION = 2

TOKEN_DTYPE = np.int32
LOGPROB_DTYPE = np.float32
MASK_DTYPE = np.uint8  # on the wire: 1 = a token the model sampled, 0 = an environment token


class WireError(ValueError):
    """A message was rejected. `reason` is a short label (metrics), the text says what and why."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class SampleInfo(Struct, array_like=True, frozen=True, omit_defaults=True):
    """Per-sample scalars of a group; the sample's tokens and log-probs are in the bulk frames."""

    num_tokens: int
    reward: float
    finish_reason: Literal["stop", "length"]
    correction: float | None = None
    """Multi-layer GRPO, layer 1: the reward of this sample's first correction (left out otherwise)."""
    last_version: int | None = None
    """In-flight updates: the newest policy version that sampled one of its tokens, when newer than the group's."""


class FilteredCensus(Struct, array_like=True, frozen=True):
    """Layer-1 groups an actor's dynamic filter dropped (actors.filter_zero_variance) since it last sent a
    group, and their samples in each census cell (failed/passed × A > 0 / A ≤ 0, the run's estimator).
    The next group the actor sends carries them, so the step that trains it logs the census before
    filtering as well as after (`census_before_*` in metrics.jsonl)."""

    groups: int
    failed_pos: int
    failed_nonpos: int
    passed_pos: int
    passed_nonpos: int

    def __add__(self, other: "FilteredCensus") -> "FilteredCensus":
        return FilteredCensus(*(a + b for a, b in zip(msgspec.structs.astuple(self), msgspec.structs.astuple(other))))


class GroupEntry(Struct, array_like=True, frozen=True):
    """One group inside a GroupBatchHeader: its fields, the arrays aside."""

    prompt_id: str
    policy_version: int
    num_prompt_tokens: int
    samples: list[SampleInfo]
    created_at: float
    seq: int = -1
    layer: int = 1
    """1: a prompt's group; 2: a multi-layer GRPO correction group (its prompt is the layer-2 query)."""
    filtered: FilteredCensus | None = None
    """Groups the actor filtered out before this one (dynamic filtering), for the census before filtering."""
    reward_failures: dict[str, Annotated[int, Meta(ge=0)]] | None = None
    """Samples the actor's reward functions left unscored since its previous group, by reason; None: none."""


class GroupBatchHeader(Struct, tag="scored_group_batch", kw_only=True):
    """Frame 0 of one or more scored groups of one actor session in one message.

    Frames 1..3 hold the groups' prompt tokens, completion tokens and behaviour log-probs
    concatenated in `groups` order: group k's slices start where group k-1's end. No offsets
    travel, so none can disagree with the lengths; the lengths must add up to the frames. Frame 4,
    present only when some group has environment tokens, is the model-token mask over the completion
    tokens (uint8, 1 = sampled by the model, 0 = environment; all 1 for a group without any).
    """

    schema: int = SCHEMA_VERSION
    actor_id: str
    session: str = ""
    sent_at: float = 0.0
    groups: list[GroupEntry]


class TensorInfo(Struct, array_like=True, frozen=True):
    """One tensor of a state dict: its name, torch dtype name (e.g. "float32") and shape."""

    name: str
    dtype: str
    shape: list[int]

    @classmethod
    def of(cls, name: str, dtype, shape) -> "TensorInfo":
        """From a torch dtype and shape (torch.float32, (2, 3) -> "float32", [2, 3])."""
        return cls(name=name, dtype=str(dtype).removeprefix("torch."), shape=list(shape))


class WeightsChunk(Struct, tag="weights_chunk", kw_only=True):
    """Frame 0 of one chunk of a weight version; frames 1.. hold its bytes, in order (split where the
    sender sends pieces of tensors in place).

    A version is one flat buffer of `total` bytes, tensor i at byte `offsets[i]` (increasing,
    non-overlapping, aligned to its dtype, at most 64 bytes of padding between tensors), cut into
    `count = ceil(total / chunk_bytes)` chunks (one when total is 0): chunk `index` is bytes
    [index × chunk_bytes, +chunk_bytes) of it, the last one shorter. Every chunk carries the whole
    layout, so a receiver can start from any chunk, and checks it against the others of its version.
    """

    schema: int = SCHEMA_VERSION
    version: int
    tensors: list[TensorInfo]
    offsets: list[int]
    total: int
    """Bytes of the version's flat buffer."""
    chunk_bytes: int
    """Bytes of every chunk but the last."""
    index: int = 0
    sent_at: float = 0.0
    learner: str = ""
    """Which life of the learner sent it: a new value tells actors the learner restarted (resync)."""

    @property
    def count(self) -> int:
        return max(1, -(-self.total // self.chunk_bytes))


class WeightsCollective(Struct, tag="weights_collective", kw_only=True):
    """Announces that `version` follows over the collective weight-sync group (transport.weight_sync=
    collective), cut into `buckets` of one dtype each (see streamrl.comm.weight_sync): receivers join the
    broadcast when they see this, and allocate from it."""

    schema: int = SCHEMA_VERSION
    version: int
    buckets: list[list[TensorInfo]]
    sent_at: float = 0.0
    learner: str = ""


class WeightsRequest(Struct, tag="weights_request", kw_only=True):
    """An actor asks the learner for its newest weights (on start, or when it missed a broadcast)."""

    schema: int = SCHEMA_VERSION
    actor_id: str
    have_version: int = -1
    fingerprint: dict[str, Any] | None = None
    """The settings that shape the actor's model, data and rewards (streamrl.run.fingerprint); the learner
    refuses an actor whose differ from its own (absent: an actor from before the handshake, admitted)."""


REFUSED = "refused: "  # a Shutdown reason with this prefix: the learner refused this actor (the rest says why)


class Shutdown(Struct, tag="shutdown", kw_only=True):
    """The learner is done; actors finish their current group and exit. A reason starting with REFUSED is sent to
    one actor the learner will not train on; that actor exits with an error naming the reason."""

    schema: int = SCHEMA_VERSION
    reason: str = "done"


class Demand(Struct, tag="demand", kw_only=True):
    """The learner has waited in vain at `version` and still needs `groups_missing` groups.

    An actor that held back to stay within the staleness bound makes more when it sees this, so
    fewer live actors than configured (one crashed, or a cluster started with fewer) slow a run
    down instead of stalling it.
    """

    schema: int = SCHEMA_VERSION
    version: int
    groups_missing: int


class ActorReport(Struct, tag="actor_report", kw_only=True):
    """An actor's last message on the group channel: what this life of it sent.

    ZeroMQ keeps a connection's messages in order, so once the learner has this report it has
    every group the actor sent before it: `groups_sent` must equal what the learner received.
    """

    schema: int = SCHEMA_VERSION
    actor_id: str
    session: str
    groups_sent: int
    groups_generated: int
    reason: str = "shutdown"
    reward_failures: dict[str, Annotated[int, Meta(ge=0)]] = {}
    """Samples its reward functions left unscored, by reason (streamrl.tasks.reward_functions.REASONS)."""


class EvalRequest(Struct, tag="eval_request", kw_only=True):
    """The learner asks one actor (on the requests channel) to evaluate rows [start, stop) of eval set `set`
    with the weights of `version`, sampled as `streamrl.evaluation` samples (eval.* settings, seed `seed`)."""

    schema: int = SCHEMA_VERSION
    version: Annotated[int, Meta(ge=0)]
    set: str
    """The eval set's name (eval.sets; "" for the task's own eval set)."""
    start: Annotated[int, Meta(ge=0)]
    stop: Annotated[int, Meta(ge=0)]
    seed: int
    attempt: Annotated[int, Meta(ge=0)] = 0
    """0 for the first request of this shard; n for its n-th re-issue (its actor died or missed the deadline)."""


class EvalResult(Struct, tag="eval_result", kw_only=True):
    """An actor's answer to an EvalRequest (on the group channel): the shaped reward of every sample of every row
    of its shard, (stop - start, n); a row left empty is a prompt with no room under model.max_seq_len."""

    schema: int = SCHEMA_VERSION
    actor_id: str
    version: Annotated[int, Meta(ge=0)]
    set: str
    start: Annotated[int, Meta(ge=0)]
    stop: Annotated[int, Meta(ge=0)]
    rewards: list[list[float]]
    unparseable: Annotated[int, Meta(ge=0)] = 0
    """Samples the task could not parse (scored lowest)."""
    corrected: list[bool] | None = None
    """Multi-layer GRPO: whether each sample's correction verified, samples in row order; None otherwise."""
    eval_s: float = 0.0
    error: str = ""
    """Non-empty: the actor could not evaluate this shard (why); rewards is then empty."""

    def check(self, n: int) -> None:
        """Raises WireError unless the shard's table is (stop - start) rows of n finite rewards (or empty rows)."""
        if self.error:
            return
        if len(self.rewards) != self.stop - self.start:
            raise WireError("eval_shape", f"eval result for rows [{self.start}, {self.stop}) of {self.set!r} has "
                            f"{len(self.rewards)} rows")
        if any(len(row) not in (0, n) for row in self.rewards):
            raise WireError("eval_shape", f"eval result rows of {self.set!r} must hold {n} samples (or none)")
        if not all(math.isfinite(r) for row in self.rewards for r in row):
            raise WireError("non_finite_reward", f"eval result for {self.set!r} holds a non-finite reward")


Header = Union[GroupBatchHeader, WeightsChunk, WeightsCollective, WeightsRequest, Shutdown, Demand, ActorReport,
               EvalRequest, EvalResult]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Header)


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
    ) -> "ScoredGroup":
        """last_versions[i]: the newest version that sampled sample i (in-flight updates); kept only when
        newer than policy_version, which stays the oldest and is what the staleness gate judges.

        model_token_masks[i]: (T_i,) bool aligned with completions[i], True where the model sampled the
        token, False under an environment token; None: all the model's. logprobs stay aligned with
        every token; entries under environment tokens are ignored (sent as 0). A group whose masks are
        all True travels as one without masks (and arrives with model_token_mask None)."""
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
                           correction=None if corrections is None else float(corrections[i]), last_version=last[i])
                for i, (c, r, f) in enumerate(zip(completions, rewards, finish_reasons))
            ],
            layer=layer,
            model_token_mask=mask,
        )

    make = from_samples  # the name issue 26's multi-turn episodes build groups by


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
                           g.layer, g.filtered, g.reward_failures) for g in groups],
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
    return [_encoder.encode(header), *arrays]


def _has_environment_tokens(group: ScoredGroup) -> bool:
    return group.model_token_mask is not None and not group.model_token_mask.all()


_ARRAYS = (("prompt_tokens", TOKEN_DTYPE), ("completion_tokens", TOKEN_DTYPE), ("behaviour_logprobs", LOGPROB_DTYPE))


def group_nbytes(group: ScoredGroup) -> int:
    """Bytes of a group's bulk arrays (what it adds to a message, headers aside)."""
    return (group.prompt_tokens.nbytes + group.completion_tokens.nbytes + group.behaviour_logprobs.nbytes
            + (group.model_token_mask.nbytes if _has_environment_tokens(group) else 0))


def encode(msg: WeightsCollective | WeightsRequest | Shutdown | Demand | ActorReport | EvalRequest
           | EvalResult) -> list[bytes]:
    """Frames for a header-only message."""
    return [_encoder.encode(msg)]


def decode_header(frames: Sequence) -> Header:
    """Decode and version-check frame 0; raises WireError("bad_header" | "schema_version" | ...)."""
    if not frames:
        raise WireError("empty", "message has no frames")
    try:
        header = _decoder.decode(_buffer(frames[0]))
    except msgspec.ValidationError as e:
        raise WireError("bad_header", f"header does not match any message type: {e}") from None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError, ValueError) as e:
        # Bad UTF-8 in a string field or absurd nesting surface as these, not as DecodeError.
        raise WireError("bad_frame", f"frame 0 is not a msgpack header: {type(e).__name__}: {e}") from None
    if header.schema != SCHEMA_VERSION:
        raise WireError(
            "schema_version", f"{type(header).__name__} schema {header.schema}, this build speaks {SCHEMA_VERSION}"
        )
    return header


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
        ScoredGroup(
            prompt_id=e.prompt_id,
            policy_version=e.policy_version,
            actor_id=actor,
            prompt_tokens=prompt[p0:p1],
            completion_tokens=tokens[t0:t1],
            behaviour_logprobs=logprobs[t0:t1],
            samples=e.samples,
            created_at=e.created_at,
            sent_at=sent_at,
            session=session,
            seq=e.seq,
            layer=e.layer,
            filtered=e.filtered,
            reward_failures=e.reward_failures,
        )
        for e, p0, p1, t0, t1 in zip(entries, prompt_starts, prompt_starts[1:], token_starts, token_starts[1:])
    ]
    if mask is not None:  # set afterwards: the usual groups without one pay nothing per group
        for g, t0, t1 in zip(groups, token_starts, token_starts[1:]):
            g.model_token_mask = mask[t0:t1]
    return groups


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


def encode_chunk_header(header: WeightsChunk) -> bytes:
    return _encoder.encode(header)


def chunk_payload(frames: Sequence, header: WeightsChunk) -> list[memoryview]:
    """The bytes of one weights chunk (frames 1.., which together hold them in order), checked against
    its header's own fields (index, sizes, version); the layout is checked once per version (`layout`).
    Raises WireError."""
    # A chunk's frames are pieces of its tensors and the bytes between them: at most two per tensor, plus one.
    if not 2 <= len(frames) <= 2 * len(header.tensors) + 2:
        raise WireError("frame_count", f"weights chunk needs 2 to {2 * len(header.tensors) + 2} frames for its "
                        f"{len(header.tensors)} tensors, got {len(frames)}")
    if header.version < 0:
        raise WireError("bad_version", f"weights version {header.version} < 0")
    if header.chunk_bytes < 1 or header.total < 0:
        raise WireError("bad_chunk", f"weights version {header.version}: chunk_bytes {header.chunk_bytes}, "
                        f"total {header.total} (need chunk_bytes ≥ 1, total ≥ 0)")
    if not 0 <= header.index < header.count:
        raise WireError("bad_chunk", f"weights version {header.version}: chunk {header.index} of {header.count}")
    bufs = [_buffer(f) for f in frames[1:]]
    start = header.index * header.chunk_bytes
    expected = min(header.chunk_bytes, header.total - start)
    got = sum(len(b) for b in bufs)
    if got != expected:
        raise WireError("length_mismatch", f"weights version {header.version} chunk {header.index}: {got} bytes, "
                        f"its place in the {header.total}-byte version holds {expected}")
    return bufs


# Padding the flat layout may put after a tensor (the learner aligns tensors to 64 bytes); more is rejected,
# so a version cannot carry bytes no tensor accounts for.
_MAX_PAD = 64


def layout(header: WeightsChunk) -> list[tuple[str, object, int, int, list[int]]]:
    """(name, torch dtype, numel, byte offset, shape) of every tensor of a version, checked against its
    `total` bytes; raises WireError("bad_offset" | "length_mismatch" | "duplicate_tensor" | ...)."""
    offsets = header.offsets
    if len(offsets) != len(header.tensors):
        raise WireError("bad_offset", f"{len(offsets)} offsets for {len(header.tensors)} tensors")
    out, seen, end = [], set(), 0
    for info, offset in zip(header.tensors, offsets):
        dtype, numel = _tensor_type(info, seen)
        seen.add(info.name)
        if offset < end:
            raise WireError("bad_offset", f"tensor {info.name!r} at byte {offset} overlaps the previous one "
                            f"(ends at {end}) or goes backwards")
        if offset - end > _MAX_PAD:
            raise WireError("bad_offset", f"tensor {info.name!r} at byte {offset}: {offset - end} unused bytes before "
                            f"it (at most {_MAX_PAD})")
        if offset % dtype.itemsize:
            raise WireError("bad_offset", f"tensor {info.name!r} at byte {offset} is not aligned to its "
                            f"{dtype.itemsize}-byte dtype")
        end = offset + numel * dtype.itemsize
        if end > header.total:
            raise WireError("bad_offset", f"tensor {info.name!r} ends at byte {end}, past the {header.total}-byte "
                            "version")
        out.append((info.name, dtype, numel, offset, info.shape))
    if header.total - end > _MAX_PAD:
        raise WireError("length_mismatch", f"weights version is {header.total} bytes, its tensors end at {end}")
    return out


def tensors(buf, entries: list) -> dict:
    """{name: tensor} viewing `buf` (a version's whole flat buffer) at the offsets of `layout(...)`."""
    return {name: _view(buf, dtype, numel, offset).view(shape) for name, dtype, numel, offset, shape in entries}


def _tensor_type(info: TensorInfo, seen: dict):
    """(torch dtype, numel) of a tensor header entry, checked; WireError if not a valid new tensor."""
    import torch

    if info.name in seen:
        raise WireError("duplicate_tensor", f"tensor {info.name!r} appears twice")
    if any(d < 0 for d in info.shape):
        raise WireError("bad_shape", f"tensor {info.name!r} has shape {info.shape}")
    dtype = getattr(torch, info.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise WireError("bad_dtype", f"tensor {info.name!r} has unknown dtype {info.dtype!r}")
    return dtype, math.prod(info.shape)


def _view(buf: memoryview, dtype, numel: int, offset: int):
    """A (numel,) tensor sharing memory with `buf` from byte `offset` (no copy)."""
    import warnings

    import torch

    if not numel:
        return torch.empty(0, dtype=dtype)
    with warnings.catch_warnings():  # received buffers are read-only; we only ever copy out of them
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(buf, dtype=dtype, count=numel, offset=offset)


def _buffer(frame) -> memoryview:
    return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)


def _array(frame, dtype, count: int, what: str) -> np.ndarray:
    buf = _buffer(frame)
    itemsize = np.dtype(dtype).itemsize
    if len(buf) != count * itemsize:
        raise WireError("length_mismatch", f"{what}: {len(buf)} bytes, header says {count} × {itemsize}")
    return np.frombuffer(buf, dtype=dtype)
