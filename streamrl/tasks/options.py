"""Each built-in task's own options: the keys it adds to the `task` section beyond the ones every run shares
(streamrl.config.task), validated here, beside the tasks, and declared with each task in `specs`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta

from streamrl.registry import Options

Fraction = Annotated[float, Meta(ge=0, le=1)]
PositiveInt = Annotated[int, Meta(gt=0)]
PositiveFloat = Annotated[float, Meta(gt=0)]


class SymbolOptions(Options):
    """The symbol tasks' prompts: an alphabet and a length."""

    num_symbols: Annotated[int, Meta(ge=2, le=26)] = 4
    """Alphabet size of the built-in symbol tasks."""
    length: Annotated[int, Meta(ge=1, le=64)] = 4
    """Prompt length in symbols for the built-in symbol tasks."""


class LookupOptions(Options):
    """The lookup task: its alphabet and its credits (an episode looks a key up with the lookup tool)."""

    num_symbols: Annotated[int, Meta(ge=2, le=26)] = 4
    """Alphabet size: the values a key may hold (a guess without the tool is right 1 in num_symbols)."""
    options: dict[str, Any] = {}
    """lookup: keys (4), credit (0: a right lookup answered wrong) and call_credit (0: another key looked up)."""


class ScaleOptions(Options):
    """A reward quantised onto an ordinal scale of steps, and the prompt's template."""

    scale_steps: Annotated[int, Meta(ge=1, le=1000)] = 10
    """The reward is quantised to 0, 1/steps, ..., 1 (the paper's 10-step scale)."""
    template: str | None = None
    """Prompt template: code_verifier pairs use {question} {response_a} {response_b}, reasoning_gym {question}."""


class VerifierOptions(ScaleOptions):
    """The paper's pairwise code verifier: its scale, templates and trained reward form."""

    single_fraction: Fraction = 0.1
    """Synthetic data: share of single-response judgement prompts."""
    single_template: str | None = None
    """Single-response template with {question} {response_a}; null: the built-in one."""
    reward_form: Literal["bce", "exp"] = "bce"
    """Trained reward of a level q: bce = -BCE = ln q (the paper's, <= 0) or exp = exp(-BCE) = q."""
    bce_floor: Annotated[float, Meta(gt=0, lt=1)] = 1e-3
    """bce form: q is floored here before the log, so q = 0 trains on ln(bce_floor), not -inf."""
    rounding: Literal["half_up", "half_down"] = "half_up"
    """q onto the scale rounds half up (0.45 -> 0.5 on 10 steps: a tie) or half down (0.45 -> 0.4)."""

    def __post_init__(self) -> None:
        if self.bce_floor >= 1 / self.scale_steps:  # would merge the lowest levels
            raise ValueError(f"bce_floor={self.bce_floor}: must be below the scale's first step 1/scale_steps "
                             f"({1 / self.scale_steps:g})")


class MathOptions(Options):
    """Math with a final answer: the prompt's template."""

    template: str | None = None
    """Prompt template with {problem}; null: built-in."""


class ReasoningGymOptions(ScaleOptions):
    """reasoning-gym's procedural datasets (nothing downloaded): which one, its options, the scale."""

    dataset: str | None = None
    """The reasoning-gym dataset name (e.g. spell_backward, leg_counting, basic_arithmetic)."""
    options: dict[str, Any] = {}
    """Keyword options of reasoning_gym.create_dataset (size: 1000 and seed: 0 unless given)."""


class RowsOptions(Options):
    """A task over rows of task.data (dataset, agent, skyrl_gym, openenv, verifiers): which column is the prompt."""

    prompt_field: str = "prompt"
    """The column holding the prompt, a string or a list of chat messages (the rest go to the reward)."""


class DatasetOptions(RowsOptions):
    """A dataset scored by reward functions in TRL's signature (task.reward)."""
    reward_weights: list[float] = []
    """Weight of each task.reward function in the sum ([]: 1 each)."""
    reward_workers: PositiveInt = 4
    """Threads scoring groups side by side in each actor."""
    reward_timeout_s: PositiveFloat = 30.0
    """Longest one reward call may take; a longer one is counted and its samples retried alone."""


class SkyRLOptions(RowsOptions):
    """SkyRL-Gym environments (task.environment: an env id or a BaseTextEnv class)."""

    env_config: dict[str, Any] = {}
    """The env_config its envs are made with (SkyRL's skyrl_gym config section for the env)."""


class OpenEnvOptions(RowsOptions):
    """OpenEnv environments: a running server (env_url) or one each actor serves (env_app)."""

    env_url: str | None = None
    """The base URL of a running OpenEnv server (http://host:port); or task.env_app."""
    env_app: str | None = None
    """What each actor serves on loopback: an app from create_app, or an Environment class ('module:name')."""
    env_action_field: str = "message"
    """The Action field the model's reply fills (the rest of the Action keeps its defaults)."""
    env_observation_field: str = "message"
    """The Observation field whose text is the environment's next user message ("": none)."""

    def __post_init__(self) -> None:
        if (self.env_url is None) == (self.env_app is None):
            raise ValueError(f"env_url={self.env_url!r}: task openenv needs exactly one of task.env_url (a running server) and task.env_app "
                             f"('module:app', served by each actor); got env_app={self.env_app!r}")


class VerifiersOptions(RowsOptions, kw_only=True):
    """A verifiers environment (or verifiers 0.4 taskset), run as an agent through the actor's endpoint."""

    verifiers_env: str
    """An environment id, 'path/file.py' or 'module:loader'; verifiers 0.4: a taskset id or package dir."""
    verifiers_args: dict[str, Any] = {}
    """Keyword arguments of the environment's load_environment; verifiers 0.4: the taskset's config."""
