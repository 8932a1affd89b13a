"""Messages that cross a socket: msgspec Structs with a type tag and a schema version.

A message is a list of ZeroMQ frames: frame 0 is the msgspec-encoded header, and bulk arrays
follow as separate frames so they travel without copies. Scored groups have one format, a batch
(GroupBatchHeader; its arrays and their checks are streamrl.comm.codec's). Weights have one layout:
a version is one flat byte buffer (every tensor at an aligned offset) that travels as chunks under
the message cap (WeightsChunk; streamrl.comm.weights.chunks checks the layout). The collective sync's and CUDA
IPC's messages are streamrl.comm.sync_messages', decoded here with the rest.

Nothing here ever unpickles: decoding is msgspec plus explicit checks, and every failure is a
`WireError` with a short `reason` label that receivers count by.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Sequence, Union

import msgspec
import numpy as np
from msgspec import Meta, Struct

from streamrl.comm.schema import SCHEMA_VERSION
from streamrl.comm.sync_messages import TensorInfo, WeightsCollective, WeightsIpc, WeightsIpcAck  # noqa: F401

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
    scored: bool = True
    """False: no score came for it (a reward function or environment failed on it) and its reward stands in
    (the group's mean, or the lowest level in an episode), so it is left out of the reward the run reports."""
    parts: list[float | None] | None = None
    """Each reward function's value, in task.reward's order (None: not applicable or failed); None: not such a task."""
    turns: int | None = None
    """A multi-turn episode's model turns (None: a single-turn sample). For the samples log."""
    tool_calls: dict[str, int] | None = None
    """A multi-turn episode's tool calls, 'tool/outcome' → calls (None: a single-turn sample)."""
    turn_layout: list[Annotated[int, Meta(ge=0)]] | None = None
    """An episode's turns in order, flat: [role code (turn_spans.ROLES), tokens] each; None: a single-turn sample."""
    turn_tools: list[list[str]] | None = None
    """The tools each tool turn of turn_layout answered, tool turns in order (None: no tool turn)."""


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
    episode_counts: dict[str, Annotated[int, Meta(ge=0)]] | None = None
    """Multi-turn episodes the actor played since its previous group: episodes, tool_calls/<tool>/<outcome>,
    truncated/<reason>, step_raised; None: none (and from actors before it)."""


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
    checksum: int | None = None
    """XXH3-64 of the chunk's bytes (frames 1.., in order; streamrl.comm.weights.chunks.checksum): a full chunk
    without one, or whose bytes do not match it, is refused and the version asked for again. None only as a
    WeightsDelta's layout (the delta carries the CRC-32 of the bytes it makes)."""

    @property
    def count(self) -> int:
        return max(1, -(-self.total // self.chunk_bytes))


class WeightsDelta(Struct, tag="weights_delta", kw_only=True):
    """One chunk of a weight version sent as the difference from version `base` (transport.weights_delta):
    frame 1 is zstd(new chunk bytes XOR base chunk bytes), where the chunk is bytes [index × chunk_bytes,
    +chunk_bytes) of the flat buffer `layout` describes (a WeightsChunk with the same fields, which the
    receiver assembles as it would a full version). `crc32` is zlib.crc32 of the new chunk's bytes: a
    receiver whose base differs, or whose bytes do not check, drops the version and asks for a full one."""

    schema: int = SCHEMA_VERSION
    layout: WeightsChunk
    base: int
    """The version this chunk is the difference from (the learner's previous publish)."""
    crc32: int


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
    counts: dict[str, int] | None = None
    """Who covers, and for how many: the actors that delivered their share of the batch, the missing groups split
    among them exactly; an actor not named makes none. None: every actor takes on `groups_missing` (no shares: the
    batch takes groups as they come). Optional, so a build without it still decodes the message (msgspec skips an
    unknown field, and fills a missing one with its default): no schema change."""

    def count_for(self, actor_id: str) -> int:
        """The missing groups `actor_id` takes on."""
        return self.groups_missing if self.counts is None else self.counts.get(actor_id, 0)


class Pace(Struct, tag="pace", kw_only=True):
    """How actors generate from learner version `version` on (`staleness.Throttle.pace`).

    `lead`: versions past the newest weights an actor may generate for, max_staleness while the measured drift
    is within `max_drift`, 0 (hold: one share per version) while it is over, so groups are not made to be thrown
    away. `actors`: the actors that share each batch, in the order their shares are planned (`planned_share` by
    position); an actor that joined the run is in it from `version`, and actors not in it make no share.
    """

    schema: int = SCHEMA_VERSION
    version: Annotated[int, Meta(ge=0)]
    lead: Annotated[int, Meta(ge=0)]
    actors: list[str]
    drift: float | None = None
    """The drift (KL(behaviour ‖ learner), the largest group's) that set `lead`; None: none measured yet."""


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
    """Samples its reward functions left unscored, by reason (streamrl.tasks.reward_functions.REASONS), with
    calls_failed (every failed call, retried or not) and groups_unscored (groups with nothing scored, not sent)."""
    episode_counts: dict[str, Annotated[int, Meta(ge=0)]] = {}
    """Multi-turn episodes: `episodes`, tool calls as `tool_calls/<tool>/<outcome>`, `truncated/<reason>`."""


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


class PromptsRequest(Struct, tag="prompts_request", kw_only=True):
    """An actor asks the learner's dealer (task.epochs) for up to `want` prompts, and says what became of dealt
    prompts that made no group: `filtered` (ids a filter removed) and `dropped` (id -> why it made none)."""

    schema: int = SCHEMA_VERSION
    actor_id: str
    session: str
    want: Annotated[int, Meta(ge=0, le=100_000)]
    filtered: list[str] = []
    dropped: dict[str, str] = {}
    learner: str = ""
    """The learner start that dealt the prompts reported (a restarted learner ignores an earlier one's)."""


class Deal(Struct, tag="deal", kw_only=True):
    """The dealer's answer: (epoch, row) of each prompt dealt; `done`: every epoch is dealt out, ask no more."""

    schema: int = SCHEMA_VERSION
    rows: list[tuple[int, int]] = []
    done: bool = False
    learner: str = ""
    """Which start of the learner dealt it: prompts in hand from an earlier one are given up (it re-deals them)."""


class ActorFailure(Struct, tag="actor_failure", kw_only=True):
    """An actor's word that a user's function (a reward function, grader, environment, tool) is broken
    (streamrl.tasks.reward_health): it fails on most of its samples, so the run must stop and say why. Sent on the
    group channel just before the actor exits."""

    schema: int = SCHEMA_VERSION
    actor_id: str
    session: str
    function: str
    """The function's reference as the config names it (task.reward), or the names summed for a scale failure."""
    reason: str
    """The failures' most common reason (streamrl.tasks.reward_functions.REASONS)."""
    failed: Annotated[int, Meta(ge=0)]
    window: Annotated[int, Meta(ge=1)]
    error: str
    """The error's one line (for a raise, its last traceback line: `KeyError: 'answer'`)."""
    traceback: str
    """The first failure's traceback (or what was wrong with the returned value)."""
    reward_failures: dict[str, Annotated[int, Meta(ge=0)]] = {}
    """Every failure of the session so far, by reason (samples; calls_failed: calls)."""
    kind: str = "reward function"
    """What the function is (streamrl.tasks.reward_health.KINDS: reward function, grader, environment, tool,
    agent); an actor from before kinds existed meant a reward function."""
    unit: str = "samples"
    """What its window counts: samples, episodes (an environment), calls (a tool)."""


Header = Union[GroupBatchHeader, WeightsChunk, WeightsDelta, WeightsCollective, WeightsIpc, WeightsIpcAck,
               WeightsRequest, Shutdown, Demand, Pace, ActorReport, EvalRequest, EvalResult, PromptsRequest, Deal,
               ActorFailure]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Header)


def encode(msg: Header) -> list[bytes]:
    """Frames for a header-only message (or frame 0 of one with bulk frames)."""
    return [_encoder.encode(msg)]


def decode_header(frames: Sequence) -> Header:
    """Decode and version-check frame 0; raises WireError("bad_header" | "schema_version" | ...)."""
    if not frames:
        raise WireError("empty", "message has no frames")
    try:
        header = _decoder.decode(buffer(frames[0]))
    except msgspec.ValidationError as e:
        raise WireError("bad_header", f"header does not match any message type: {e}") from None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError, ValueError) as e:
        # Bad UTF-8 in a string field (UnicodeDecodeError before msgspec 0.23) or absurd nesting surface as these too.
        raise WireError("bad_frame", f"frame 0 is not a msgpack header: {type(e).__name__}: {e}") from None
    if header.schema != SCHEMA_VERSION:
        raise WireError(
            "schema_version", f"{type(header).__name__} schema {header.schema}, this build speaks {SCHEMA_VERSION}"
        )
    return header


def buffer(frame) -> memoryview:
    return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
