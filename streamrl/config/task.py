"""The `task` section: what every task shares (the prompt source's rows, its reward's scale and health, the
multi-turn environment, the agent); each task's own options are parsed by its Struct (streamrl.tasks.options)."""

from __future__ import annotations

import math
from typing import Annotated, Any

from msgspec import Meta

from streamrl.config.base import Fraction, PositiveFloat, PositiveInt
from streamrl.config.plugged import PluginSection
from streamrl.registry import ENVIRONMENTS, TASKS, TOOL_PARSERS


class TaskConfig(PluginSection):
    SELECTORS = (("name", TASKS), ("environment", ENVIRONMENTS))
    SECTION = "task"

    name: str = "copy"
    """Task from the task registry (see `streamrl.tasks.TASKS`)."""
    data: str | None = None
    """Training rows (.jsonl, .json, .parquet, a save_to_disk folder or hub id): dataset, code_verifier, math."""
    eval_data: str | None = None
    """Evaluation rows in the same form (null: drawn from the training stream, or the synthetic set)."""
    epochs: Annotated[int, Meta(ge=0)] = 0
    """Passes over task.data, each a seeded permutation; the run ends after the last unless `steps` comes first (0: rows drawn with replacement)."""
    max_row_bytes: PositiveInt = 1 << 20
    """Largest data row in bytes (a JSONL line; a table row as JSON): a longer one is named and skipped unread."""
    reward: str | list[str] | None = None
    """dataset: reward function(s) in TRL's signature, 'package.module:function' or 'path/file.py:function'."""
    reward_levels: list[float] = []
    """dataset: the reward's scale, ascending, numbers or fractions ("1/3"); off it: counted, unscored; []: bucket."""
    reward_level_tolerance: Annotated[float, Meta(ge=0)] = 0.01
    """dataset: a reward this close to a level of reward_levels is that level (0.33 is 1/3); below half their gap."""
    reward_fail_window: PositiveInt = 50
    """Each reward function's (agent's) last this many samples (environment: episodes, tool: calls) judge it."""
    reward_fail_threshold: Fraction = 0.5
    """A reward function, agent, environment or tool failing on more than this share of its window stops the run (1: never)."""
    reward_overlap: bool = True
    """dataset: score a generate call's groups while the next call generates (async, no dynamic rollouts or MGRPO)."""
    vocabulary: list[str] = []
    """Data-row tasks (dataset, agent, verifiers, skyrl_gym, openenv), tiny word-level model: extra words to write."""
    environment: str | None = None
    """Multi-turn episodes: the environment class, 'package.module:Class', 'path/file.py:Class' or an entry point; skyrl_gym: its env id or BaseTextEnv class; openenv: its EnvClient class (null: GenericEnvClient)."""
    max_turns: PositiveInt = 4
    """environment: most model turns per episode (more: the episode ends truncated)."""
    tool_parser: str = "auto"
    """environment: how tool calls are read from a reply: qwen3 | words | auto (qwen3 with a chat template)."""
    tool_timeout_s: PositiveFloat = 30.0
    """environment: longest one tool call may run; a longer one is abandoned and the model told it timed out."""
    tool_workers: PositiveInt = 8
    """environment: threads running tool calls in each actor, while other episodes generate."""
    agent: str | None = None
    """agent: fn(client, row) -> float | dict, 'package.module:fn' or 'path/file.py:fn'; client: openai.OpenAI on the actor."""
    agent_workers: PositiveInt = 64
    """agent, verifiers: episodes at once per actor, a thread each (async: a coroutine); >= prompts_per_generate x G."""
    agent_timeout_s: PositiveFloat = 60.0
    """agent, verifiers: longest one episode may run; a longer one is abandoned, counted, scored lowest."""
    opts: dict[str, Any] = {}
    """The options of the task and environment it names, parsed by their Structs from the section's other keys."""

    def __post_init__(self) -> None:
        if self.name not in TASKS:
            raise ValueError(f"name={self.name!r}: {TASKS.unknown(self.name)}")
        super().__post_init__()
        if TASKS.can(self.name, "reward_functions") and (not self.data or not (self.reward or self.environment)):
            raise ValueError(f"name={self.name}: needs task.data (a data file) and task.reward (a function) or "
                             f"task.environment (episodes rewarded by it); got "
                             f"data={self.data!r}, reward={self.reward!r}")
        if self.epochs and not self.data:
            raise ValueError(f"epochs={self.epochs}: epochs pass over task.data; name={self.name!r} has no data "
                             "file (give task.data, or epochs: 0 to sample)")
        rollout = TASKS.can(self.name, "agent_rollout")
        if rollout and TASKS.can(self.name, "rows") and (not self.data or not self.agent):
            raise ValueError(f"name={self.name}: needs task.data (the rows each episode's agent is given) and task.agent "
                             f"('package.module:fn' or 'file.py:fn'); got data={self.data!r}, agent={self.agent!r}")
        if TASKS.can(self.name, "episodes") and TASKS.can(self.name, "rows") and not self.data:
            raise ValueError(f"name={self.name}: needs task.data (the rows each episode's environment is made from)")
        if TASKS.can(self.name, "names_environment") and not self.environment:
            raise ValueError(f"name={self.name}: needs task.environment, a registered env id or 'module:Class' / "
                             "'file.py:Class' (a BaseTextEnv subclass)")
        if self.agent and not (rollout and TASKS.can(self.name, "rows")):
            raise ValueError(f"agent={self.agent!r}: only a task with agent rollouts over rows (task.name="
                             f"{' or '.join(n for n in TASKS.with_capability('agent_rollout') if TASKS.can(n, 'rows'))}"
                             f") runs an agent (name={self.name!r})")
        self._check_levels()
        if self.tool_parser != "auto" and self.tool_parser not in TOOL_PARSERS:
            raise ValueError(f"tool_parser={self.tool_parser!r}: {TOOL_PARSERS.unknown(self.tool_parser)}, or auto")

    def _check_levels(self) -> None:
        if any(b <= a for a, b in zip(self.reward_levels, self.reward_levels[1:])):
            raise ValueError(f"reward_levels={self.reward_levels}: must be strictly increasing (an ordinal scale)")
        gap = min((b - a for a, b in zip(self.reward_levels, self.reward_levels[1:])), default=math.inf)
        if self.reward_level_tolerance >= gap / 2:
            raise ValueError(f"reward_level_tolerance={self.reward_level_tolerance}: must be below half the smallest "
                             f"gap between task.reward_levels ({gap / 2:g}), or a reward could be two levels")
        refs = [self.reward] if isinstance(self.reward, str) else self.reward or []
        weights = self.options_of("reward_weights") or []
        if weights and len(weights) != len(refs):
            raise ValueError(f"reward_weights={weights}: needs one weight per task.reward ({len(refs)})")

    def options_of(self, key: str) -> Any:
        """The task's own option `key`, or None where its task has no such option."""
        return getattr(self.options_for(TASKS), key, None)


def rollout_kind(task: TaskConfig) -> str:
    """How the samples of a task config are made, from its task's capabilities (the registry's): "agent_episodes" where
    it declares `agent_rollout`, "environment_episodes" where it declares `episodes` or task.environment is set (any
    single-turn task may play an environment's episodes: the environment gives the reward), else "single_turn"."""
    if TASKS.can(task.name, "agent_rollout"):
        return "agent_episodes"
    return "environment_episodes" if task.environment or TASKS.can(task.name, "episodes") else "single_turn"
