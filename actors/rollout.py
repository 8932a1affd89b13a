"""One rollout step: prompts → G completions each (more where dynamic rollouts ask) → rewards →
ScoredGroups stamped with the policy version that generated them, minus the filtered ones; under
multi-layer GRPO, then each response → a correction → the verified corrections' layer-2 groups.

Prompts are encoded as the model expects (`streamrl.models.prompting`: the chat template when there is
one) and the length cap is on prompt + completion (`model.max_seq_len`, else the model's positions:
`streamrl.models.context`): completions are cut at their prompt's room, and a prompt with no room is skipped
and counted (`prompts_too_long`)."""

from __future__ import annotations

import logging
import math
import random
from typing import Callable

import msgspec

from streamrl.config import Config
from streamrl.actors.backends import Backend, Completion
from streamrl.algo import group_filters, learning_signal, mgrpo
from streamrl.comm.codec import ScoredGroup
from streamrl.models import context, prompting
from streamrl.models.sampling import capped
from streamrl.tasks import Prompt
from streamrl.tasks.rewards import Reward


class RolloutOptions(msgspec.Struct, frozen=True):
    group_size: int
    r_min_correct: float
    rollout_factor: int = 1
    """> 1: dynamic rollouts, up to rollout_factor × G samples per prompt."""
    filter_zero_variance: bool = False
    phrases: tuple[str, ...] = ()
    """Non-empty: multi-layer GRPO with this pool of guiding phrases."""
    augment: int = 0
    """H: further samples of each kept correction's query."""
    query_limit: int = 0
    """Most tokens of a layer-2 query (0: no cap); see mgrpo.query_limit."""
    context: int = 0
    """The model's context (models.context.seq_cap): a correction is cut where it ends (0: unknown here)."""
    estimator: str = ""
    """The run's advantage estimator: the census of layer-1 groups before and after filtering ('': not counted)."""
    std_normalize: bool = False
    """GRPO's std normalisation, as the learner applies it (the census needs the sign of A only, but exactly)."""
    chat_template: str = "off"
    """Prompt encoding: auto | on | off (model.chat_template)."""
    enable_thinking: bool | None = None
    """The chat template's thinking switch (model.enable_thinking); None: the template's default."""
    max_new_tokens: int | None = None
    """Completion cap (actors.max_new_tokens); None: the backend's own cap only."""
    max_seq_len: int | None = None
    """Cap on prompt + completion tokens (model.max_seq_len, else the model's positions); None: not known."""
    max_prompt_tokens: int | None = None
    """A longer prompt is skipped and counted (model.max_prompt_tokens; not layer-2 queries); None: none."""

    @classmethod
    def from_config(cls, cfg: Config) -> "RolloutOptions":
        m = cfg.mgrpo
        return cls(group_size=cfg.actors.group_size, r_min_correct=cfg.advantage.r_min_correct,
                   rollout_factor=cfg.actors.rollout_factor, filter_zero_variance=cfg.actors.filter_zero_variance,
                   phrases=tuple(m.phrases) if m.enabled else (),
                   augment=(cfg.actors.group_size - 1 if m.augment is None else m.augment) if m.enabled else 0,
                   query_limit=mgrpo.query_limit(cfg, context.seq_cap(cfg.model) or 0) if m.enabled else 0,
                   context=(context.seq_cap(cfg.model) or 0) if m.enabled else 0,
                   estimator=cfg.advantage.estimator, std_normalize=cfg.advantage.std_normalize,
                   chat_template=cfg.model.chat_template, enable_thinking=cfg.model.enable_thinking,
                   max_new_tokens=cfg.actors.max_new_tokens, max_seq_len=context.seq_cap(cfg.model),
                   max_prompt_tokens=cfg.model.max_prompt_tokens)

    def encode(self, tokenizer, text: str | Prompt) -> list[int]:
        """Token ids of a prompt (its chat messages where it has them) or of a text."""
        return prompting.encode(tokenizer, prompting.content(text),
                                prompting.uses_chat_template(tokenizer, self.chat_template), self.enable_thinking)

    def room(self, ids: list[int], prompt: bool = True) -> int:
        """Completion tokens the prompt `ids` leaves under the caps (≤ 0: none). prompt: a task's prompt, which
        max_prompt_tokens also bounds (a layer-2 query holds a response as well: it is not)."""
        if prompt and self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
            return 0
        if self.max_new_tokens is None:
            return 1 << 30 if self.max_seq_len is None else self.max_seq_len - len(ids)
        return prompting.room(len(ids), self.max_new_tokens, self.max_seq_len)


class RolloutStats(msgspec.Struct):
    """What one rollout step did besides making groups (the actor's metrics add these up)."""

    extra_samples: int = 0
    """Samples drawn beyond G by dynamic rollouts."""
    filtered_zero_variance: int = 0
    """Groups dropped because all their rewards were equal."""
    unparseable: int = 0
    """Completions the reward could not parse (scored lowest)."""
    corrections: int = 0
    """Multi-layer GRPO: layer-2 corrections sampled (one per layer-1 response)."""
    corrections_kept: int = 0
    """Corrections the verifier found correct, each the seed of a layer-2 group."""
    layer2_unsent: int = 0
    """Layer-2 groups not sent because their layer-1 group was not (unscored, or filtered for equal rewards): a
    layer-2 group trains in its layer-1 group's batch or not at all."""
    queries_capped: int = 0
    """Multi-layer GRPO: layer-2 queries cut to fit the model's context."""
    query_tokens_cut: int = 0
    """Tokens those cuts removed."""
    # The paper's census (failed/passed × A > 0 / A ≤ 0) in layer-1 samples, before dynamic filtering and
    # after it (the groups sent, which the learner's census counts), with the run's estimator.
    census_before_failed_pos: int = 0
    census_before_failed_nonpos: int = 0
    census_before_passed_pos: int = 0
    census_before_passed_nonpos: int = 0
    census_after_failed_pos: int = 0
    census_after_failed_nonpos: int = 0
    census_after_passed_pos: int = 0
    census_after_passed_nonpos: int = 0
    prompts_too_long: int = 0
    """Prompts (and layer-2 queries) skipped: no room under model.max_seq_len, or over model.max_prompt_tokens."""
    # Reward functions by reference (streamrl.tasks.reward_functions): samples left unscored, by reason.
    reward_raised: int = 0
    reward_timeout: int = 0
    reward_bad_return: int = 0
    reward_non_finite: int = 0
    reward_out_of_scale: int = 0
    reward_none: int = 0
    reward_calls_failed: int = 0
    """Calls of a reward function that failed, each counted (a group's call and each one-sample retry)."""
    reward_no_model_call: int = 0
    """Agent episodes (task.name: agent) whose agent returned without calling the model."""
    reward_bad_data: int = 0
    """Episodes whose row lacked what the user's code read (streamrl.tasks.data_errors): never trained on."""
    groups_unscored: int = 0
    """Groups not sent because no sample in them could be scored."""


Sample = tuple[Completion, str, float]  # a completion, its text, its reward
log = logging.getLogger("streamrl.actor")


def sample_prompts(task, rng: random.Random, k: int, keep: Callable[[str], bool] | None = None,
                   max_draws: int = 1000) -> list[Prompt]:
    """k prompts; with `keep` (online difficulty filtering), prompts it rejects are skipped, up to
    max_draws draws in all (fewer prompts come back when nearly everything is excluded)."""
    if keep is None:
        return [task.sample(rng) for _ in range(k)]
    out: list[Prompt] = []
    for _ in range(max_draws):
        if len(out) == k:
            break
        p = task.sample(rng)
        if keep(p.id):
            out.append(p)
    return out


def _sample(backend: Backend, tokenizer, reward: Reward, prompts: list[Prompt], ids: list[list[int]],
            n: int, between_steps: Callable[[], int] | None = None, caps: list[int] | None = None,
            stats: RolloutStats | None = None) -> list[list[Sample]]:
    """n scored samples for each prompt (ids: its token ids; caps: its completions' length cap). A grouped
    reward that leaves a sample unscored gives it its group's mean (NaN when none is scored: the group is
    then not sent); the failures are added to `stats`."""
    drawn, texts = _draw(backend, tokenizer, ids, n, between_steps, caps)
    if reward.grouped:  # every group's call side by side on the reward pool
        return _scored(reward, drawn, texts, reward.submit_groups(prompts, texts, _tokens(drawn)), stats)
    rewards = [[reward(prompt, t) for t in ts] for prompt, ts in zip(prompts, texts)]
    return [list(zip(cs, ts, rs)) for cs, ts, rs in zip(drawn, texts, rewards)]


def _draw(backend: Backend, tokenizer, ids, n, between_steps=None, caps=None):
    """(completions, their texts), each (len(ids), n)."""
    # Only backends that can pause between decoding steps take between_steps (the config checks which).
    # between_steps is passed only when in-flight updates use it: a backend that never pauses may not take it
    drawn = backend.generate(ids, n) if between_steps is None else backend.generate(ids, n, between_steps)
    if caps is not None:  # the whole-sequence cap: cut where the prompt's room ends
        drawn = [[capped(c, max(0, caps[j])) for c in completions] for j, completions in enumerate(drawn)]
    texts = [[tokenizer.decode(c.tokens, skip_special_tokens=True) for c in completions] for completions in drawn]
    return drawn, texts


def _tokens(drawn) -> list[list[list[int]]]:
    return [[list(c.tokens) for c in cs] for cs in drawn]


def _scored(reward: Reward, drawn, texts, handle, stats: RolloutStats | None) -> list[list[Sample]]:
    """The samples of a grouped reward's submitted calls (`handle`), once scored; failures added to `stats`."""
    parts: list = []
    scored, failures = reward.collect_groups(handle, parts)
    if stats is not None:
        for why, count in failures.items():
            setattr(stats, f"reward_{why}", getattr(stats, f"reward_{why}") + count)
    out = []
    for cs, ts, rs, ps in zip(drawn, texts, scored, parts):
        filled = [SampleReward(r, r.scored, p) for r, p in zip(fill_unscored(rs), ps or [None] * len(rs))]
        out.append(list(zip(cs, ts, filled)))
    return out


class SampleReward(float):
    """A sample's reward, and what its group tells the learner of it: whether it was scored (False: its group's
    mean stands in for the score it did not get) and each reward function's own value (`parts`). They travel with
    the sample through selection (dynamic rollouts) into its group (`_group`)."""

    def __new__(cls, value: float, scored: bool = True, parts: list | None = None):
        r = super().__new__(cls, value)
        r.scored, r.parts = scored, parts
        return r


def fill_unscored(rewards: list[float | None]) -> list[float]:
    """Unscored samples (None) take the mean of the scored ones (marked unscored: a SampleReward), so they move no
    other sample's advantage under a mean baseline; with none scored, NaN (the group is dropped and counted)."""
    scored = [r for r in rewards if r is not None]
    mean = sum(scored) / len(scored) if scored else math.nan
    return [SampleReward(mean, scored=False) if r is None else SampleReward(r) for r in rewards]


def _group(prompt_id: str, ids: list[int], samples: list[Sample], version: int, actor_id: str,
           corrections: list[float] | None = None, layer: int = 1) -> ScoredGroup:
    return ScoredGroup.from_samples(
        prompt_id=prompt_id, policy_version=version, actor_id=actor_id, prompt_tokens=ids,
        completions=[c.tokens for c, _, _ in samples], logprobs=[c.logprobs for c, _, _ in samples],
        rewards=[r for _, _, r in samples], finish_reasons=[c.finish_reason for c, _, _ in samples],
        corrections=corrections, layer=layer,
        last_versions=[c.versions[1] if c.versions else None for c, _, _ in samples],
        scored=[getattr(r, "scored", True) for _, _, r in samples],
        parts=[getattr(r, "parts", None) for _, _, r in samples])


def make_groups(backend: Backend, tokenizer, reward: Reward, prompts: list[Prompt], opts: RolloutOptions,
                policy_version: int, actor_id: str, rng: random.Random | None = None,
                observe: Callable[[str, list[float]], None] | None = None,
                between_steps: Callable[[], int] | None = None) -> tuple[list[ScoredGroup], RolloutStats]:
    """Layer-1 groups, each right after (multi-layer GRPO) the layer-2 groups of its responses' verified corrections:
    sent in this order, they reach the learner just ahead of the layer-1 group whose batch they join (learner.escort).
    rng draws the guiding phrases;
    observe(prompt_id, rewards) sees every prompt's layer-1 rewards, filtered groups included.
    between_steps: in-flight updates (see Backend.generate); groups keep `policy_version`, the
    oldest version of their samples, and each sample records the newest."""
    stats, unparseable_before = RolloutStats(), reward.unparseable
    prompts, ids = _fitting(tokenizer, prompts, opts, stats, actor_id)
    if not prompts:
        return [], stats
    chosen = _layer1(backend, tokenizer, reward, prompts, ids, opts, stats, between_steps)
    corrections: list[list[float] | None] = [None] * len(prompts)
    layer2: list[list[ScoredGroup]] = [[] for _ in prompts]
    if opts.phrases:
        corrections, layer2 = _layer2(backend, tokenizer, reward, prompts, ids, chosen, opts, policy_version, actor_id,
                                      rng or random.Random(), stats, between_steps)
    groups = _finish(prompts, ids, chosen, corrections, opts, policy_version, actor_id, stats, observe, layer2)
    stats.unparseable = reward.unparseable - unparseable_before
    return groups, stats


class Started(msgspec.Struct):
    """A generate call whose groups the reward pool is still scoring (`start_groups`)."""

    prompts: list
    ids: list
    drawn: list
    texts: list
    handle: object
    version: int
    actor_id: str
    stats: RolloutStats


def start_groups(backend: Backend, tokenizer, reward: Reward, prompts: list[Prompt], opts: RolloutOptions,
                 policy_version: int, actor_id: str, between_steps: Callable[[], int] | None = None) -> Started:
    """Generate G samples per prompt and hand them to the grouped reward's pool without waiting, so the caller's
    next generate call overlaps their scoring (`finish_groups` collects them). Layer 1 only, one round."""
    stats = RolloutStats()
    prompts, ids = _fitting(tokenizer, prompts, opts, stats, actor_id)
    drawn, texts = _draw(backend, tokenizer, ids, opts.group_size, between_steps, [opts.room(i) for i in ids]) \
        if prompts else ([], [])
    handle = reward.submit_groups(prompts, texts, _tokens(drawn)) if prompts else None
    return Started(prompts, ids, drawn, texts, handle, policy_version, actor_id, stats)


def finish_groups(started: Started, reward: Reward, opts: RolloutOptions,
                  observe: Callable[[str, list[float]], None] | None = None) -> tuple[list[ScoredGroup], RolloutStats]:
    """The groups of a started call, once its scores are in (as make_groups would have made them)."""
    stats = started.stats
    if not started.prompts:
        return [], stats
    chosen = _scored(reward, started.drawn, started.texts, started.handle, stats)
    groups = _finish(started.prompts, started.ids, chosen, [None] * len(chosen), opts, started.version,
                     started.actor_id, stats, observe)
    return groups, stats


def _fitting(tokenizer, prompts: list[Prompt], opts: RolloutOptions, stats: RolloutStats, actor_id: str):
    """(prompts, their token ids) that leave room for a completion; the others are counted and logged."""
    ids = [opts.encode(tokenizer, p) for p in prompts]
    fits = [opts.room(i) > 0 for i in ids]
    if not all(fits):
        stats.prompts_too_long += fits.count(False)
        log.warning("%s: %d prompt(s) skipped: longer than model.max_prompt_tokens=%s or no room for a completion "
                    "in %s tokens (model.max_seq_len, else the model's positions; longest prompt %d tokens)",
                    actor_id, fits.count(False), opts.max_prompt_tokens, opts.max_seq_len, max(map(len, ids)))
        prompts = [p for p, ok in zip(prompts, fits) if ok]
        ids = [i for i, ok in zip(ids, fits) if ok]
    return prompts, ids


def _finish(prompts, ids, chosen, corrections, opts: RolloutOptions, policy_version: int, actor_id: str,
            stats: RolloutStats, observe=None, layer2: list[list[ScoredGroup]] | None = None) -> list[ScoredGroup]:
    """Layer-1 groups of scored samples, each after its layer-2 groups (layer2[i]: prompt i's): unscored ones and
    (dynamic filtering) equal-reward ones dropped and counted, with their layer-2 groups; the census before and
    after filtering."""
    groups = []
    for i, (prompt, p_ids, samples, corr) in enumerate(zip(prompts, ids, chosen, corrections)):
        riders = layer2[i] if layer2 else []
        if any(math.isnan(r) for _, _, r in samples):  # no sample of it could be scored
            stats.groups_unscored += 1
            stats.layer2_unsent += len(riders)
            continue
        if observe is not None:
            observe(prompt.id, [r for _, _, r in samples])
        if opts.filter_zero_variance and group_filters.zero_variance([r for _, _, r in samples]):
            stats.filtered_zero_variance += 1
            stats.layer2_unsent += len(riders)
            continue
        groups += [*riders, _group(prompt.id, p_ids, samples, policy_version, actor_id, corr)]
    if opts.estimator:  # the paper's census before and after dynamic filtering, over the groups that were scored
        scored = [[r for _, _, r in c] for c in chosen if not any(math.isnan(r) for _, _, r in c)]
        for stage, rows in (("before", scored), ("after", [g.rewards for g in groups])):
            for cell, n in learning_signal.census_counts(rows, opts.estimator, opts.r_min_correct,
                                                         opts.std_normalize).items():
                setattr(stats, f"census_{stage}_{cell}", n)
    return groups


def _layer1(backend, tokenizer, reward, prompts, ids, opts: RolloutOptions, stats: RolloutStats,
            between_steps=None) -> list[list[Sample]]:
    """G samples per prompt; with dynamic rollouts, more for groups lacking a correct or a failed sample,
    then the G of largest reward variance."""
    pools: list[list[Sample]] = [[] for _ in prompts]
    pending = list(range(len(prompts)))
    for round_ in range(opts.rollout_factor):
        drawn = _sample(backend, tokenizer, reward, [prompts[i] for i in pending], [ids[i] for i in pending],
                        opts.group_size, between_steps, [opts.room(ids[i]) for i in pending], stats)
        for i, samples in zip(pending, drawn):
            pools[i] += samples
        stats.extra_samples += opts.group_size * len(pending) if round_ else 0
        pending = [i for i in pending if not group_filters.diverse([r for _, _, r in pools[i]], opts.r_min_correct)]
        if not pending:
            break
    chosen = []
    for pool in pools:
        keep = (group_filters.max_variance_subset([r for _, _, r in pool], opts.group_size)
                if len(pool) > opts.group_size else range(opts.group_size))
        chosen.append([pool[i] for i in keep])
    return chosen


def _layer2(backend, tokenizer, reward, prompts, prompt_ids: list[list[int]], chosen: list[list[Sample]],
            opts: RolloutOptions, version: int, actor_id: str, rng: random.Random, stats: RolloutStats,
            between_steps=None) -> tuple[list[list[float]], list[list[ScoredGroup]]]:
    """One correction per layer-1 response; the correct ones, each with `augment` more samples of its
    query, become layer-2 groups. Returns each layer-1 group's correction rewards and its new groups.
    A query continues the response's own tokens (mgrpo.layer2_ids); one longer than `query_limit` keeps the
    original prompt and the end of the response with the phrase, and is counted."""
    owners, q_ids = [], []  # owners[j]: the original prompt of layer-2 query j
    for prompt, p_ids, samples in zip(prompts, prompt_ids, chosen):
        for completion, _, _ in samples:
            phrase = mgrpo.phrase_ids(tokenizer, mgrpo.pick_phrase(opts.phrases, rng))
            ids = mgrpo.layer2_ids(p_ids, completion.tokens, completion.finish_reason == "stop", phrase)
            ids, cut = mgrpo.cap_query(ids, opts.query_limit, len(p_ids))
            stats.queries_capped += bool(cut)
            stats.query_tokens_cut += cut
            q_ids.append(ids)
            owners.append(prompt)
    # A correction ends where the model's context does (the engine's limit, also where model.max_seq_len is unset).
    caps = [min(opts.room(q, prompt=False), opts.context - len(q)) if opts.context else opts.room(q, prompt=False)
            for q in q_ids]
    stats.prompts_too_long += sum(c <= 0 for c in caps)  # sampled with no room: an empty correction, never kept
    # The verifier of a correction is the original prompt's reward: score against `owners`, not the query.
    first = [s[0] for s in _sample(backend, tokenizer, reward, owners, q_ids, 1, between_steps, caps, stats)]
    stats.corrections += len(first)
    per_group = [[r for _, _, r in first[i * opts.group_size:(i + 1) * opts.group_size]] for i in range(len(prompts))]
    kept = [j for j, (_, _, r) in enumerate(first) if r >= opts.r_min_correct and caps[j] > 0]
    stats.corrections_kept += len(kept)
    groups: list[list[ScoredGroup]] = [[] for _ in prompts]
    if kept and opts.augment:
        more = _sample(backend, tokenizer, reward, [owners[j] for j in kept], [q_ids[j] for j in kept], opts.augment,
                       between_steps, [caps[j] for j in kept], stats)
        for j, extra in zip(kept, more):
            groups[j // opts.group_size].append(_group(f"{owners[j].id}/t2/{j % opts.group_size}", q_ids[j],
                                                       [first[j], *extra], version, actor_id, layer=2))
    return per_group, groups
