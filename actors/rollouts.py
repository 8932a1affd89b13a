"""The actor's one rollout protocol: prompts → ScoredGroups, whatever a sample is.

A task says how its samples are made by its capabilities (`streamrl.config.rollout_kind`; any single-turn task plays
episodes of `task.environment` where one is set):

- "single_turn": G completions per prompt, scored by the task (`SingleTurn`, over `streamrl.actors.rollout`);
- "environment_episodes": G episodes per prompt of the task's `environment_class()` (else task.environment's), turns driven
  by the actor, tools on a thread pool (`streamrl.actors.environment_episodes`); SkyRL-Gym and OpenEnv environments
  arrive through their adapters as such classes;
- "agent_episodes": G episodes per prompt of the task's `agent_fn`, which drives its turns through the actor's
  OpenAI-compatible endpoint (`streamrl.actors.agents`); both verifiers stacks arrive through their tasks as such
  functions.

Each is a `Rollout`: `make_groups(prompts, version, observe, between_steps)` → (groups, what episodes did, the call's
counts), then `close()`. The two episode kinds share `streamrl.actors.episodes.EpisodeRunner`, and with it one rule
for an episode's reward level.
"""

from __future__ import annotations

from typing import Callable, Protocol

from streamrl.actors import rollout
from streamrl.actors.episodes import EpisodeStats
from streamrl.actors.rollout import RolloutStats
from streamrl.comm.codec import ScoredGroup
from streamrl.config import Config, rollout_kind


class Rollout(Protocol):
    """How an actor's generate call makes its groups (one per task rollout kind)."""

    def make_groups(self, prompts: list, version: int, observe: Callable | None = None,
                    between_steps: Callable[[], int] | None = None
                    ) -> tuple[list[ScoredGroup], EpisodeStats, RolloutStats]:
        """The groups of `prompts` made with the weights of `version` (observe(prompt_id, rewards): difficulty
        tracking; between_steps: in-flight updates), what episodes did, the call's counts."""

    def close(self) -> None:
        """Let go of threads, pools and sockets."""


class SingleTurn:
    """rollout "single_turn": G completions per prompt, scored by the task (`streamrl.actors.rollout`)."""

    def __init__(self, backend, tokenizer, reward, options: rollout.RolloutOptions, actor_id: str, phrase_rng):
        self.backend, self.tokenizer, self.reward, self.options = backend, tokenizer, reward, options
        self.actor_id, self.phrase_rng = actor_id, phrase_rng

    def make_groups(self, prompts, version, observe=None, between_steps=None):
        groups, done = rollout.make_groups(self.backend, self.tokenizer, self.reward, prompts, self.options, version,
                                           self.actor_id, self.phrase_rng, observe=observe,
                                           between_steps=between_steps)
        return groups, EpisodeStats(), done

    def close(self) -> None:
        pass


def runner(cfg: Config, index: int, backend, tokenizer, reward, actor_id: str, end_ids: list[int],
           options: rollout.RolloutOptions, phrase_rng) -> Rollout:
    """The `Rollout` of the task's kind (`config.rollout_kind`); end_ids: every end token of the model."""
    kind = rollout_kind(cfg.task)
    if kind == "agent_episodes":
        from streamrl.actors.agents import AgentEpisodes

        return AgentEpisodes(cfg, index, backend, tokenizer, reward, actor_id, end_ids)
    if kind == "environment_episodes":
        from streamrl.actors.environment_episodes import EnvironmentEpisodes

        return EnvironmentEpisodes(cfg, backend, tokenizer, reward, actor_id, end_ids)
    return SingleTurn(backend, tokenizer, reward, options, actor_id, phrase_rng)
