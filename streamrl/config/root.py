"""The whole run's config: the top-level keys, one field per section, and the checks that span sections."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

import msgspec

from streamrl.config.actors import ActorConfig
from streamrl.config.advantage import AdvantageConfig
from streamrl.config.base import NonNegInt, PositiveFloat, PositiveInt, _Section
from streamrl.config.difficulty import DifficultyConfig
from streamrl.config.endpoint import EndpointConfig
from streamrl.config.evaluation import EvalConfig
from streamrl.config.grader import GraderConfig
from streamrl.config.learner import LearnerConfig
from streamrl.config.log import LogConfig
from streamrl.config.lora import LoraConfig
from streamrl.config.loss import LossConfig
from streamrl.config.mgrpo import MGRPOConfig
from streamrl.config.model import ModelConfig
from streamrl.config.monitoring import MonitoringConfig
from streamrl.config.optim import OptimConfig
from streamrl.config.reward import RewardConfig
from streamrl.config.task import TaskConfig, rollout_kind
from streamrl.config.transport import TransportConfig
from streamrl.ordinal import shaped_levels
from streamrl.registry import BACKENDS, TASKS


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
    max_drift: PositiveFloat | None = 0.01
    """Actors hold to one batch share per version while a step's largest group KL(behaviour‖learner) exceeds this."""
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
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    """What the run directory keeps of the model's completions (samples.jsonl; `streamrl samples RUN`)."""
    endpoint: EndpointConfig = msgspec.field(default_factory=EndpointConfig)
    """The OpenAI-compatible endpoint each actor serves over its engine for agent tasks (task.name: agent)."""

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
        self._check_backend()
        if rollout_kind(self.task) != "single_turn":
            self._check_episodes()
        if self.eval.every_epoch and not self.task.epochs:
            raise ValueError("eval.every_epoch=true: needs task.epochs (a run without epochs has no epoch end; "
                             "use eval.every for a step interval)")
        if self.on_policy == "strict" and self.learner.publish_every != 1:
            raise ValueError(f"learner.publish_every={self.learner.publish_every}: on_policy strict needs 1 "
                             "(actors must see every version)")
        if self.on_policy == "strict" and self.learner.minibatches != 1:
            raise ValueError(f"learner.minibatches={self.learner.minibatches}: on_policy strict needs 1 (after a "
                             "batch's first optimizer step the learner is no longer the policy that sampled it)")
        if self.strict:  # the bound resolved once: every reader (gate, throttle, gauge, labels) sees 0
            self.max_staleness = 0

    def _check_backend(self) -> None:
        """What the run asks of its generation backend, against what the backend declares it can do."""
        backend = self.actors.backend
        can = functools.partial(BACKENDS.can, backend)
        sync = self.transport.weight_sync
        if sync != "zmq" and not can(f"{sync}_sync"):
            raise ValueError(f"transport.weight_sync={sync}: wired for actors.backend="
                             f"{' or '.join(BACKENDS.with_capability(f'{sync}_sync'))} only (the {backend} engine "
                             "takes weights over ZeroMQ, from shared memory or in buckets); use zmq")
        if sync != "zmq" and can(f"{sync}_in_engine") and (self.lora.rank or self.eval.every):
            raise ValueError(f"transport.weight_sync={sync} with actors.backend={backend}: its engine "
                             "loads each version itself, so the actor holds no copy to make LoRA adapters from "
                             f"(lora.rank={self.lora.rank}) or to go back to for an evaluation "
                             f"(eval.every={self.eval.every}); use weight_sync=zmq, or neither")
        if self.strict and self.actors.top_p < 1 and not can("full_logprobs"):
            raise ValueError(f"actors.top_p={self.actors.top_p} with actors.backend={backend}: on_policy strict refuses "
                             "it (the engine reports log-probs of the top-p truncated distribution, the learner "
                             "recomputes the full one); use top_p=1, another backend, or on_policy=async")
        if self.actors.inflight_updates and self.strict:
            raise ValueError("actors.inflight_updates=true: on_policy strict forbids it (a sample's tokens would come "
                             "from two policy versions); use on_policy=async")
        if self.actors.inflight_updates and not can("inflight_updates"):
            raise ValueError(f"actors.inflight_updates=true: the {backend} backend loads weights between generate "
                             "calls only; in-flight updates need actors.backend="
                             f"{' or '.join(BACKENDS.with_capability('inflight_updates'))}")
        if self.actors.inflight_updates and self.lora.rank and not can("inflight_lora"):
            raise ValueError(f"actors.inflight_updates=true with lora.rank > 0 on {backend}: a running request keeps "
                             "the LoRA adapter it started with (each version is a new LoRARequest), so nothing would "
                             "land in flight; use inflight_updates=false, or the hf backend")

    def _check_episodes(self) -> None:
        """Multi-turn episodes run one way for now: layer 1, one round, weights between generate calls."""
        clash = {"mgrpo.enabled=true": self.mgrpo.enabled, f"actors.rollout_factor={self.actors.rollout_factor}":
                 self.actors.rollout_factor > 1, "actors.inflight_updates=true": self.actors.inflight_updates,
                 f"eval.every={self.eval.every}": self.eval.every > 0}
        if bad := [k for k, v in clash.items() if v]:
            what = (f"task.environment={self.task.environment!r}" if self.task.environment
                    else f"task.name={self.task.name}")
            raise ValueError(f"{what}: multi-turn episodes do not combine with "
                             f"{', '.join(bad)} yet")

    def _check_reward_scale(self) -> None:
        if TASKS.can(self.task.name, "declared_levels") and not self.task.reward_levels and not self.reward.bucket_edges:
            raise ValueError(f"task.reward_levels=[]: a {self.task.name} task's reward needs a scale: declare its levels "
                             "(task.reward_levels), or bucket a continuous reward with reward.bucket_edges")

    def _check_r_min_correct(self) -> None:
        """R_min_correct is the minimum reward of a correct trajectory: a level of the shaped scale above the
        lowest. A value within float noise of a level is snapped to it (a YAML literal of ln(2/3) and the level
        the task computes must compare equal)."""
        levels, r = self.reward_levels(), self.advantage.r_min_correct
        match = [lv for lv in levels[1:] if abs(lv - r) <= 1e-9 * max(1.0, abs(lv))]
        if not match:
            allowed = ", ".join(repr(lv) for lv in levels[1:])
            raise ValueError(f"advantage.r_min_correct={r!r}: not a level of the shaped reward scale above its lowest "
                             f"({self.task.name}, reward.bucket_edges={self.reward.bucket_edges}); allowed: {allowed}")
        self.advantage.r_min_correct = match[0]

    def reward_levels(self) -> list[float]:
        """The shaped reward levels of this run, from the config alone (no task is built, no data read)."""
        cls = TASKS.get(self.task.name)
        edges = self.reward.bucket_edges
        levels = cls.levels(self.task, edges) if TASKS.member(cls, "levels_take_edges") else cls.levels(self.task)
        return shaped_levels(levels, edges, self.reward.bucket_values, TASKS.member(cls, "reward_map")(self.task))

    @property
    def strict(self) -> bool:
        return self.on_policy == "strict"

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir) / self.name
