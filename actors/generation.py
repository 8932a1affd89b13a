"""An actor's generate calls: prompts from its own stream → groups of G scored samples, at most
the staleness budget of them, with what each call did added up for the actor's stats."""

from __future__ import annotations

import functools
import logging
import random
import time
from typing import Callable

from streamrl.actors import rollout, rollouts
from streamrl.actors.dealt import DealtPrompts
from streamrl.actors.episodes import EpisodeStats
from streamrl.algo import difficulty
from streamrl.algo.learning_signal import CENSUS_KEYS
from streamrl.comm.codec import ScoredGroup
from streamrl.comm.wire import FilteredCensus
from streamrl.config import Config, rollout_kind
from streamrl.tasks import environments
from streamrl.telemetry import actor_metrics

log = logging.getLogger("streamrl.actor")


def _observe_too(observed: dict, then, prompt_id: str, rewards: list[float]) -> None:
    observed[prompt_id] = rewards
    if then is not None:
        then(prompt_id, rewards)


class _Timed:
    """The backend as rollout sees it, adding up the seconds its generate calls take (sampling alone,
    without decoding and scoring), so the actor's stats split generate_s into sampling and the rest."""

    def __init__(self, backend):
        self.backend, self.seconds = backend, 0.0

    def generate(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.backend.generate(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0


class Generation:
    def __init__(self, cfg: Config, index: int, start_version: int, backend, tokenizer, reward,
                 telemetry: actor_metrics.ActorMetrics, dealt: DealtPrompts | None = None, health=None):
        """start_version: the version the actor's weights started at (its prompt stream depends on it); dealt: the
        learner deals the prompts (task.epochs) instead of the actor drawing them; health: the actor's /healthz
        (exporter.Health), told when each call starts and ends, so a call that never ends reports stalled."""
        self.health = health
        self.backend, self.tokenizer, self.reward, self.telemetry = backend, tokenizer, reward, telemetry
        self.actor_id = f"actor-{index}"
        self.prompts_per_call = cfg.actors.prompts_per_generate
        # The prompt stream's position: an actor that (re)joins a run at version v > 0 draws a stream
        # of its own rather than replaying the prompts its first life drew from the start.
        self.rng = random.Random(cfg.seed * 1000 + index + 1 + 7919 * start_version)
        self.dealt, self.call_prompts = dealt, []
        # Multi-layer GRPO's phrases come from a stream of their own, so the prompt stream stays as it was.
        self.phrase_rng = random.Random(f"phrases-{cfg.seed}-{index}-{start_version}")
        self.options = rollout.RolloutOptions.from_config(cfg)
        # Online difficulty filtering: prompts almost always or almost never solved stop being drawn.
        self.tracker = difficulty.SuccessTracker.from_config(cfg) if cfg.difficulty.online else None
        self.r_min_correct = cfg.advantage.r_min_correct
        self.timed = _Timed(backend)
        self.totals: dict = {"generate_s": 0.0}
        self.filtered_in_a_row = 0
        self.unsent_filtered: FilteredCensus | None = None  # filtered groups not yet carried by a sent group
        self.unsent_failures: dict[str, int] = {}  # reward failures not yet carried by a group
        self.unsent_episodes: dict[str, int] = {}  # episodes' counts not yet carried by a group
        self.played: dict[str, int] = {}  # this call's episodes' counts
        # Reward functions score a call's groups while the next call generates (task.reward_overlap): only where a
        # call's groups need no score to go on (one round, layer 1) and may wait one call (not strict).
        self.overlap = (reward.grouped and cfg.task.reward_overlap and cfg.actors.rollout_factor == 1
                        and not cfg.mgrpo.enabled and not cfg.strict)
        # A dealt prompt is accounted for when its call ends: none may be left scoring in the background.
        self.overlap = self.overlap and dealt is None
        self.pending: rollout.Started | None = None
        # How a sample is made is the task's to say (its capabilities): one completion, an environment's episode, an
        # agent's episode through the actor's endpoint. Every end token of the model (the backend's) closes a turn.
        self.episodic = rollout_kind(cfg.task) != "single_turn"
        end_ids = (backend.end_ids or [tokenizer.eos_token_id]) if self.episodic else []
        self.rollout = rollouts.runner(cfg, index, self.timed, tokenizer, reward, self.actor_id, end_ids,
                                       self.options, self.phrase_rng)
        self.overlap = self.overlap and not self.episodic  # an episode's reward comes with it
        self.episode_totals = EpisodeStats()

    def __call__(self, budget: int, version: int, between_steps: Callable[[], int] | None) -> list[ScoredGroup]:
        """Up to `budget` layer-1 groups made with the weights of `version` (between_steps: in-flight updates),
        after the layer-2 groups of their responses (multi-layer GRPO), which the budget does not count: they join
        the batch beside them."""
        if self.health is not None:
            self.health.busy("a generate call")
        try:
            return self._call(budget, version, between_steps)
        finally:
            if self.health is not None:
                self.health.done()

    def _call(self, budget: int, version: int, between_steps: Callable[[], int] | None) -> list[ScoredGroup]:
        t0 = time.perf_counter()
        tracker = self.tracker
        observe = (lambda pid, rs: tracker.observe(pid, rs, self.r_min_correct)) if tracker else None
        observed: dict[str, list[float]] = {}
        if self.dealt is not None:  # what each dealt prompt scored: a group it made none of was filtered or dropped
            observe = functools.partial(_observe_too, observed, observe)
        if self.overlap:
            groups, done = self._overlapped(budget, version, between_steps, observe)
        else:
            if not (prompts := self._prompts(min(self.prompts_per_call, budget))):
                return []
            groups, played, done = self.rollout.make_groups(prompts, version, observe, between_steps)
            self._played(played)
        if self.dealt is not None:
            groups = self.dealt.settle(self.call_prompts, groups, observed, self.options.filter_zero_variance)
        return self._finish_call(groups, done, t0)

    def _played(self, played: EpisodeStats) -> None:
        """What a call's episodes did: added up, to Prometheus, and carried by the groups that go (_account)."""
        if self.episodic:
            self.episode_totals.add(played)
            self.played = played.counts()
            self.telemetry.observe_episodes(played)

    def close(self) -> None:
        self.rollout.close()

    def _prompts(self, k: int) -> list:
        keep = self.tracker.keep if self.tracker else None
        if self.dealt is not None:
            dealt = self.dealt.take(k)
            self.call_prompts = [p for p in dealt if keep is None or keep(p.id)]
            self.dealt.filtered += [p.id for p in dealt if keep is not None and not keep(p.id)]  # difficulty
            return self.call_prompts
        prompts = rollout.sample_prompts(self.reward.task, self.rng, k, keep=keep)
        if not prompts:  # online difficulty filtering excluded (nearly) every prompt it drew
            log.warning("%s: difficulty filtering excludes nearly every prompt (%s); widen difficulty.low/high",
                        self.actor_id, self.tracker.excluded_by_reason)
            time.sleep(1.0)
        return prompts

    def _overlapped(self, budget: int, version: int, between_steps, observe):
        """Start this call's scoring and return the previous call's groups. Never across a weight update: groups
        made with older weights come back before any with newer ones start, so overlapping adds no lag."""
        pending = self.pending
        if pending is not None and pending.version != version:
            self.pending = None
            return rollout.finish_groups(pending, self.reward, self.options, observe)
        room = budget - (len(pending.prompts) if pending is not None else 0)  # made + in flight stay within budget
        prompts = self._prompts(min(self.prompts_per_call, room)) if room > 0 else []
        self.pending = (rollout.start_groups(self.timed, self.tokenizer, self.reward, prompts, self.options, version,
                                             self.actor_id, between_steps) if prompts else None)
        if pending is None:
            return [], rollout.RolloutStats()
        return rollout.finish_groups(pending, self.reward, self.options, observe)

    def finish_pending(self) -> int:
        """At the actor's end: score the call still in flight, so every reward failure is counted; its groups are
        not sent. Returns how many."""
        if self.pending is None:
            return 0
        pending, self.pending = self.pending, None
        groups, done = rollout.finish_groups(pending, self.reward, self.options)
        self._account([], done)
        return len(groups)

    def _account(self, groups, done) -> None:
        """Adds a call's counts to the totals and to Prometheus (before any over-budget trim)."""
        self.telemetry.observe_rollout(done)
        self.unsent_filtered = carry_filtered(groups, done, self.unsent_filtered)
        self.unsent_failures = carry_reward_failures(groups, done, self.unsent_failures)
        self.unsent_episodes = carry_counts(groups, "episode_counts", self.played, self.unsent_episodes)
        self.played = {}
        for key in done.__struct_fields__:
            self.totals[key] = self.totals.get(key, 0) + getattr(done, key)

    def _finish_call(self, groups, done, t0: float) -> list[ScoredGroup]:
        self.totals["generate_s"] += (gen_s := time.perf_counter() - t0)
        self.telemetry.observe_generate(groups, gen_s)
        self._account(groups, done)
        self.filtered_in_a_row = 0 if groups else self.filtered_in_a_row + done.filtered_zero_variance
        if self.filtered_in_a_row and self.filtered_in_a_row % 100 < done.filtered_zero_variance:
            log.warning("%s: the last %d groups all had equal rewards and were filtered "
                        "(actors.filter_zero_variance); nothing reaches the learner until rewards vary",
                        self.actor_id, self.filtered_in_a_row)
        return groups

    def report(self) -> dict:
        """For the actor's stats: generate time (sample_s of it in the backend's sampling, score_s decoding,
        scoring and grouping the samples), the rollout counts summed, prompts excluded by difficulty. A call still
        being scored (task.reward_overlap) is finished first, so its reward failures are counted."""
        if self.pending is not None:
            self.totals["groups_unsent_at_stop"] = self.finish_pending()
        split = {"sample_s": round(self.timed.seconds, 3),
                 "score_s": round(self.totals["generate_s"] - self.timed.seconds, 3)}
        played = {**self.episode_totals.report(), **self.rollout.bad_rows.report()} if self.episodic else {}
        if self.dealt is not None:
            split.update(prompts_dealt=self.dealt.dealt, deal_wait_s=round(self.dealt.wait_s, 3))
        return {**self.totals, **split, **played, **({"prompts_excluded": dict(self.tracker.excluded_by_reason)} if self.tracker else {})}


def carry_filtered(groups: list[ScoredGroup], done: rollout.RolloutStats,
                   unsent: FilteredCensus | None) -> FilteredCensus | None:
    """The groups dynamic filtering dropped in this call (`done`), with those of earlier calls that sent
    nothing (`unsent`), ride on the first group sent (its `filtered`), so the learner's step that trains it
    logs the census before filtering. Returns what is still unsent."""
    if done.filtered_zero_variance:
        cells = [getattr(done, f"census_before_{c}") - getattr(done, f"census_after_{c}") for c in CENSUS_KEYS]
        now = FilteredCensus(done.filtered_zero_variance, *cells)
        unsent = now if unsent is None else unsent + now
    if groups and unsent is not None:
        groups[0].filtered = unsent
        return None
    return unsent


def carry_counts(groups: list[ScoredGroup], field: str, now: dict[str, int], unsent: dict[str, int]) -> dict[str, int]:
    """This call's counts (`now`), with earlier calls' that no group carried (`unsent`), ride on the first group made
    (its `field`), so the learner's metrics.jsonl shows them as groups arrive. Returns what is still unsent."""
    counts = {k: unsent.get(k, 0) + now.get(k, 0) for k in {*unsent, *now}}
    if groups and counts:
        setattr(groups[0], field, counts)
        return {}
    return counts


def carry_reward_failures(groups: list[ScoredGroup], done: rollout.RolloutStats,
                          unsent: dict[str, int]) -> dict[str, int]:
    """This call's reward failures (`done`), with earlier calls' that no group carried (`unsent`), ride on the
    first group made (its `reward_failures`), so the learner's metrics.jsonl shows them as groups arrive. Returns
    what is still unsent. (The actor's final report holds its exact total.)"""
    counts = dict(unsent)
    for key in done.__struct_fields__:
        if (key.startswith("reward_") or key == "groups_unscored") and (n := getattr(done, key)):
            why = key.removeprefix("reward_")  # groups_unscored: a group with nothing scored, never sent
            counts[why] = counts.get(why, 0) + n
    if groups and counts:
        groups[0].reward_failures = counts
        return {}
    return counts
