"""The `learner` section: the learner process (batching, ZeRO, checkpoints, timeouts, ranks)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from streamrl.config.base import PositiveInt, NonNegInt, PositiveFloat, NonNegFloat, _Section


class LearnerConfig(_Section):
    batch_groups: PositiveInt = 16
    """Groups per optimizer step (each group holds group_size samples)."""
    zero_stage: Annotated[int, Meta(ge=0, le=3)] = 0
    """DeepSpeed ZeRO stage."""
    zero3_persistence_threshold: NonNegInt | None = None
    """ZeRO-3: parameters below this many elements stay whole on every rank (null: DeepSpeed's default, 1e5)."""
    minibatches: PositiveInt = 1
    """Optimizer steps per batch: its groups split into this many minibatches, one step each, against proximal log-probs taken once before the first (decoupled_ppo's clip; AReaL's *-4step: 4); the lr schedule counts batches. Strict mode requires 1."""
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

