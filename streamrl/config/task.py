"""The `task` section: the prompt source, its reward functions and multi-turn environment."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from msgspec import Meta

from streamrl.config.base import PositiveInt, PositiveFloat, Fraction, _Section


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
    epochs: Annotated[int, Meta(ge=0)] = 0
    """Passes over task.data, each a seeded permutation; the run ends after the last unless `steps` comes first (0: rows drawn with replacement)."""
    max_row_bytes: PositiveInt = 1 << 20
    """Largest data row in bytes (a JSONL line; a table row as JSON): a longer one is named and skipped unread."""
    prompt_field: str = "prompt"
    """dataset: the column holding the prompt, a string or a list of chat messages (the rest go to the reward)."""
    reward: str | list[str] | None = None
    """dataset: reward function(s) in TRL's signature, 'package.module:function' or 'path/file.py:function'."""
    reward_weights: list[float] = []
    """dataset: weight of each task.reward function in the sum ([]: 1 each)."""
    reward_levels: list[float] = []
    """dataset: the reward's scale, ascending, numbers or fractions ("1/3"); off it: counted, unscored; []: bucket."""
    reward_level_tolerance: Annotated[float, Meta(ge=0)] = 0.01
    """dataset: a reward this close to a level of reward_levels is that level (0.33 is 1/3); below half their gap."""
    reward_workers: PositiveInt = 4
    """dataset: threads scoring groups side by side in each actor."""
    reward_timeout_s: PositiveFloat = 30.0
    """dataset: longest one reward call may take; a longer one is counted and its samples retried alone."""
    reward_fail_window: PositiveInt = 50
    """Each reward function's (agent's) last this many samples (environment: episodes, tool: calls) judge it."""
    reward_fail_threshold: Fraction = 0.5
    """A reward function, agent, environment or tool failing on more than this share of its window stops the run (1: never)."""
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
    """Multi-turn episodes: the environment class, 'package.module:Class', 'path/file.py:Class' or an entry point; skyrl_gym: its env id or BaseTextEnv class; openenv: its EnvClient class (null: GenericEnvClient)."""
    env_config: dict[str, Any] = {}
    """skyrl_gym: the env_config its envs are made with (SkyRL's skyrl_gym config section for the env)."""
    env_url: str | None = None
    """openenv: the base URL of a running OpenEnv server (http://host:port); or task.env_app."""
    env_app: str | None = None
    """openenv: what each actor serves on loopback: an app from create_app, or an Environment[Action, Obs, State] class ('module:name', 'file.py:name')."""
    env_action_field: str = "message"
    """openenv: the Action field the model's reply fills (the rest of the Action keeps its defaults)."""
    env_observation_field: str = "message"
    """openenv: the Observation field whose text is the environment's next user message ("": none)."""
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
    agent_workers: PositiveInt = 16
    """agent, verifiers: episodes whose agent code (rollout) runs at once in each actor, each on a thread."""
    agent_timeout_s: PositiveFloat = 60.0
    """agent, verifiers: longest one episode may run; a longer one is abandoned, counted, scored lowest."""
    verifiers_env: str | None = None
    """verifiers: an environment id, 'path/file.py' or 'module:loader'; verifiers 0.4: a taskset id or package dir."""
    verifiers_args: dict[str, Any] = {}
    """verifiers: keyword arguments of the environment's load_environment; verifiers 0.4: the taskset's config."""

    def __post_init__(self) -> None:
        from streamrl.tasks import TASKS

        if self.name not in TASKS:
            raise ValueError(f"name={self.name!r}: {TASKS.unknown(self.name)}")
        if self.name == "dataset" and (not self.data or not (self.reward or self.environment)):
            raise ValueError(f"name=dataset: needs task.data (a data file) and task.reward (a function) or "
                             f"task.environment (episodes rewarded by it); got "
                             f"data={self.data!r}, reward={self.reward!r}")
        if self.epochs and not self.data:
            raise ValueError(f"epochs={self.epochs}: epochs pass over task.data; name={self.name!r} has no data "
                             "file (give task.data, or epochs: 0 to sample)")
        if self.name == "agent" and (not self.data or not self.agent):
            raise ValueError(f"name=agent: needs task.data (the rows each episode's agent is given) and task.agent "
                             f"('package.module:fn' or 'file.py:fn'); got data={self.data!r}, agent={self.agent!r}")
        if self.name in ("skyrl_gym", "openenv") and not self.data:
            raise ValueError(f"name={self.name}: needs task.data (the rows each episode's environment is made from)")
        if self.name == "skyrl_gym" and not self.environment:
            raise ValueError("name=skyrl_gym: needs task.environment, a registered env id or 'module:Class' / "
                             "'file.py:Class' (a BaseTextEnv subclass)")
        if self.name == "openenv" and (self.env_url is None) == (self.env_app is None):
            raise ValueError(f"name=openenv: needs exactly one of task.env_url (a running server) and task.env_app "
                             f"('module:app', served by each actor); got env_url={self.env_url!r}, "
                             f"env_app={self.env_app!r}")
        if (self.name == "verifiers") != bool(self.verifiers_env):
            raise ValueError(f"verifiers_env={self.verifiers_env!r} with name={self.name!r}: task.name=verifiers needs "
                             "task.verifiers_env (an installed environment id, 'file.py' or 'module:loader'), and "
                             "only it reads one")
        if self.agent and self.name != "agent":
            raise ValueError(f"agent={self.agent!r}: only task.name=agent runs an agent (name={self.name!r})")
        refs = [self.reward] if isinstance(self.reward, str) else self.reward or []
        if self.reward_weights and len(self.reward_weights) != len(refs):
            raise ValueError(f"reward_weights={self.reward_weights}: needs one weight per task.reward ({len(refs)})")
        if any(b <= a for a, b in zip(self.reward_levels, self.reward_levels[1:])):
            raise ValueError(f"reward_levels={self.reward_levels}: must be strictly increasing (an ordinal scale)")
        gap = min((b - a for a, b in zip(self.reward_levels, self.reward_levels[1:])), default=math.inf)
        if self.reward_level_tolerance >= gap / 2:
            raise ValueError(f"reward_level_tolerance={self.reward_level_tolerance}: must be below half the smallest "
                             f"gap between task.reward_levels ({gap / 2:g}), or a reward could be two levels")
        if self.name == "code_verifier" and self.bce_floor >= 1 / self.scale_steps:  # would merge the lowest levels
            raise ValueError(f"bce_floor={self.bce_floor}: must be below the scale's first step 1/scale_steps "
                             f"({1 / self.scale_steps:g})")
        from streamrl.tasks.tool_calls import PARSERS

        if self.tool_parser != "auto" and self.tool_parser not in PARSERS:
            raise ValueError(f"tool_parser={self.tool_parser!r}: {PARSERS.unknown(self.tool_parser)}, or auto")

