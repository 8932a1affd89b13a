"""One learner step, typed: collate → advantages → optimizer step (→ publish), timed, as a `Step` record.

`train` is the one place a step is built: the learner's loop, the benches (streamrl.bench) and the tests that drive
a real engine all call it, so the record they check is the record metrics.jsonl gets. The record's fields are
metrics.jsonl's keys, in its order: `Step.record()` is the line's dict (the loop adds its extras: the evaluation
that came back, the intake's accounting, elapsed_s). A field left UNSET is absent from the line, as the key was
absent from the dict before (multi-layer GRPO on a batch of neither layer, weight statistics on a step that takes
none).
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import msgspec
from msgspec import UNSET, UnsetType

from streamrl.algo import advantages
from streamrl.comm.codec import ScoredGroup
from streamrl.config import Config
from streamrl.learner import stepstats
from streamrl.learner.batch import collate
from streamrl.registry import ESTIMATORS

Opt = UnsetType  # a field only some steps have: UNSET leaves its key out of metrics.jsonl


# dict=True: the step's tensors ride along as `step.tensors` (the histograms' inputs, see stepstats.distributions)
# without being fields, so they never reach metrics.jsonl.
class Step(msgspec.Struct, kw_only=True, dict=True):
    """One learner step's metrics (docs/concepts/architecture.md, "Metric definitions"). Shapes named below: the batch of
    `groups` × G samples, B = groups × G rows of L tokens."""

    step: int
    """The step's number, from 0."""
    learner_version: int
    """The version this step made (it consumed the batch at learner_version - 1)."""
    r_count: float
    """Samples with A > 0 over those with A < 0 (inf for x/0, nan for 0/0)."""
    r_loss: float
    """|loss| of the A > 0 samples over that of the A < 0 samples."""
    loss_pos_sum: float
    """Σ |summed token loss| of the A > 0 samples (a window's r_loss is Σ pos / Σ neg)."""
    loss_neg_sum: float
    """Σ |summed token loss| of the A < 0 samples."""
    adv_pos: int
    """Samples with A > 0."""
    adv_neg: int
    """Samples with A < 0."""
    adv_zero: int
    """Samples with A = 0."""
    failed_positive_fraction: float
    """Share of samples below r_min_correct that got A > 0 (CoRPO keeps it 0)."""
    corpo_phase_fraction: float
    """Share of groups whose mean reward is below r_min_correct (CoRPO's baseline sits at the threshold)."""
    census_failed_pos: float
    """Share of the trained samples failed with A > 0 (the four census_* sum to 1)."""
    census_failed_nonpos: float
    """Share failed with A ≤ 0."""
    census_passed_pos: float
    """Share passed with A > 0."""
    census_passed_nonpos: float
    """Share passed with A ≤ 0."""
    reward_mean: float | None
    """Mean reward over the scored samples of the (groups, G) rewards (None: none scored); an unscored sample's
    stand-in reward (its group's mean, an episode's lowest level) is trained on but not reported."""
    samples_unscored: int = 0
    """Samples of the batch whose reward function or environment failed on them (scored False on the wire)."""
    success_rate: float
    """Share of samples at or above r_min_correct."""
    groups_filtered: int
    """Groups the actors' dynamic filter dropped on the way to this batch."""
    census_before_failed_pos: float
    """census_failed_pos over the trained samples plus the filtered groups' (before dynamic filtering)."""
    census_before_failed_nonpos: float
    """census_failed_nonpos before dynamic filtering."""
    census_before_passed_pos: float
    """census_passed_pos before dynamic filtering."""
    census_before_passed_nonpos: float
    """census_passed_nonpos before dynamic filtering."""
    acc_t1: float | Opt = UNSET
    """Multi-layer GRPO: accuracy of the layer-1 samples that carry a correction (mgrpo.accuracy)."""
    acc_t2: float | Opt = UNSET
    """Multi-layer GRPO: accuracy of their corrections."""
    delta_t1_t2: float | Opt = UNSET
    """acc_t2 - acc_t1."""
    delta_i2c: float | Opt = UNSET
    """Share of pairs wrong at t1 and right at t2."""
    delta_c2i: float | Opt = UNSET
    """Share of pairs right at t1 and wrong at t2."""
    layer2_groups: int | Opt = UNSET
    """Multi-layer GRPO: layer-2 groups in the batch."""
    layer2_reward_mean: float | None | Opt = UNSET
    """Their mean reward (None without any)."""
    reward_std: float
    """Standard deviation of the (groups, G) rewards."""
    advantage_mean: float
    """Mean of the (groups, G) advantages."""
    lag_max: int
    """Largest lag (learner version - the sample's policy version) in the batch; strict needs 0."""
    lag_mean: float
    """Mean lag over the groups."""
    lag_hist: dict[str, int]
    """Groups per lag, keyed by the lag as a string."""
    version_span_max: int
    """Widest span of policy versions within one sample (in-flight updates), 0 without them."""
    inflight_fraction: float
    """Share of samples that mixed policy versions."""
    is_ratio_mean: float
    """Mean importance ratio (learner / behaviour) over completion tokens of the (B, L-1) ratio."""
    is_ratio_min: float
    """Smallest importance ratio over completion tokens."""
    is_ratio_max: float
    """Largest importance ratio over completion tokens."""
    is_ratio_max_abs_dev: float
    """Largest |ratio - 1| over completion tokens."""
    kl_behaviour_learner: float
    """KL(behaviour ‖ learner) estimated over the batch's completion tokens (k3)."""
    group_kl_behaviour_learner_max: float
    """The largest per-group KL estimate: the strict check's statistic."""
    log_ratio_abs_mean: float
    """Mean |log ratio| over completion tokens."""
    sample_log_ratio_abs_max: float
    """Largest per-sample mean |log ratio| over the B samples."""
    clipped_fraction: float
    """Share of completion tokens whose ratio the loss clipped."""
    truncated_fraction: float
    """Share of completion tokens whose importance weight the objective capped (tis, seq_mask, decoupled_ppo)."""
    masked_fraction: float
    """Share of completion tokens an importance-sampling mask took out (mis/icepop, seq_mask, m2po)."""
    is_ess_fraction: float
    """Effective sample size of the tokens' importance weights w over their number N, (Σw)² / (N Σw²), in [0, 1]."""
    loss: float
    """The step's loss."""
    grad_norm: float | None
    """Global gradient norm (None when the engine reports none)."""
    lr: float
    """The learning rate the step used."""
    step_scale: float = 1.0
    """The scale on the step's lr: the ESS scale (loss.variance_control ess_step | both) times the drift scale
    (optim.target_drift); the mean over minibatches; else 1."""
    drift_per_version: float | None = None
    """KL(previous version ‖ next) per token measured on the batch's stale groups (optim.target_drift; None
    without it or without a stale group)."""
    optimizer_steps: int
    """Optimizer steps taken on the batch; strict needs 1 with optimizer_skipped."""
    optimizer_skipped: int = 0
    """Optimizer steps not taken for an exactly zero gradient (every advantage 0): weights and Adam's moments kept."""
    micro_batches: int | Opt = UNSET
    """Micro-batches with tokens this rank ran."""
    micro_batches_idle: int | Opt = UNSET
    """Empty micro-batches run to keep step with other ranks."""
    fwd_bwd_s: float | Opt = UNSET
    """Forward, log-probs, loss and backward, seconds."""
    backward_s: float | Opt = UNSET
    """Of which backward (autograd and gradient reduction), seconds."""
    optimizer_s: float | Opt = UNSET
    """The optimizer step, less the wait for the last publish's copy, seconds."""
    wait_s: float
    """Waiting for the batch's groups, seconds."""
    batch_s: float | Opt = UNSET
    """Collating the batch and its advantages, seconds."""
    train_s: float | Opt = UNSET
    """The engine's whole train_step (forward, backward, optimizer), less the wait for the last publish's copy,
    seconds."""
    publish_s: float | Opt = UNSET
    """Publishing the new version, with the wait for the last publish's copy, seconds."""
    step_s: float
    """wait_s + batch_s + train_s + publish_s."""
    samples: int
    """Samples trained on: groups × G."""
    tokens: int
    """Completion tokens trained on."""
    samples_per_s: float | None
    """samples / step_s."""
    tokens_per_s: float | None
    """tokens / step_s."""
    weights_l1: float | Opt = UNSET
    """L1 norm of every parameter (on learner.weight_stats_every steps)."""
    weights_l2: float | Opt = UNSET
    """L2 norm of every parameter."""
    weights_min: float | Opt = UNSET
    """Smallest parameter."""
    weights_max: float | Opt = UNSET
    """Largest parameter."""
    weights_mean: float | Opt = UNSET
    """Mean parameter."""
    weights_median: float | Opt = UNSET
    """Lower median parameter."""
    metrics_s: float | Opt = UNSET
    """Telemetry's share of the step (observe), seconds; the loop sets it."""

    def record(self, extra: dict | None = None) -> dict:
        """metrics.jsonl's line as a dict: the fields that are set, then `extra`'s keys."""
        return {**msgspec.to_builtins(self), **(extra or {})}


def train(engine, groups: Sequence[ScoredGroup], cfg: Config, pad_id: int, *, step: int = 0, version: int = 0,
          ranks=None, wait_s: float = 0.0, publish: Callable[[], None] | None = None,
          settled: Callable[[], float] = lambda: 0.0, weight_stats: bool = False) -> Step:
    """One optimizer step of `engine` (an Engine, or anything with its train_step) on `groups`, the batch consumed
    at learner version `version`.

    ranks: spread the step over the learner's ranks (Ranks.train_step); None trains on engine alone.
    publish: called right after the optimizer step and timed as publish_s (the loop publishes the new version).
    settled: the cumulative seconds the optimizer step spent waiting for the last publish's copy to settle; the
    step's share counts as publishing's cost, not training's. weight_stats: add the weights' statistics (after the
    publish, outside the step's timings, as every rank takes them at the same step)."""
    a = cfg.advantage
    t0 = time.perf_counter()
    batch = collate(groups, pad_id)
    adv = advantages.compute(batch.rewards, a.estimator, a.r_min_correct, a.std_normalize,
                             **a.options_dict(ESTIMATORS))
    t1 = time.perf_counter()
    before = settled()
    out, trained = (ranks.train_step(engine, batch, adv, version) if ranks is not None
                    else engine.train_step(batch, adv, version=version))
    t2 = time.perf_counter()
    settle_s = settled() - before
    if publish is not None:
        publish()
    t3 = time.perf_counter()
    timings = {"wait_s": wait_s, "batch_s": t1 - t0, "train_s": t2 - t1 - settle_s, "publish_s": t3 - t2 + settle_s}
    fields = stepstats.record(step, version, batch, adv, out, trained, a.r_min_correct, timings,
                              filtered=[g.filtered for g in groups], scored=[g.scored for g in groups])
    if weight_stats:
        fields.update(engine.weight_stats())
    done = Step(**fields)
    done.tensors = stepstats.distributions(version, batch, out)
    return done
