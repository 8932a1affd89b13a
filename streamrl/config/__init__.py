"""Typed run configuration: YAML files (a user's own, or a recipe shipped from `configs/`) plus dotted
`key=value` overrides.

Every field carries a one-line docstring. A bad key or value fails at once with one line that
names the key, the bad value and what is allowed (`ConfigError`).

One module per section (`model.py`, `task.py`, `actors.py`, ...), the whole `Config` in `root.py`, reading and
writing in `loader.py`; every name is re-exported here, so `from streamrl.config import X` is the import to use.
"""

from streamrl.config.actors import ActorConfig
from streamrl.config.advantage import AdvantageConfig
from streamrl.config.base import (ConfigError, Fraction, NonNegFloat, NonNegInt, Port, PositiveFloat, PositiveInt,
                                  _Section)
from streamrl.config.difficulty import DifficultyConfig
from streamrl.config.endpoint import EndpointConfig
from streamrl.config.evaluation import EvalConfig
from streamrl.config.grader import GraderConfig
from streamrl.config.learner import LearnerConfig
from streamrl.config.loader import (DEFAULT_CONFIG, PLUGIN_SECTIONS, dump, from_dict, load, overrides_for, to_dict)
from streamrl.config.lora import LORA_TARGETS, LoraConfig
from streamrl.config.loss import DEFAULT_LOSS, LossConfig
from streamrl.config.mgrpo import MGRPOConfig
from streamrl.config.model import ModelConfig
from streamrl.config.monitoring import MonitoringConfig
from streamrl.config.optim import OptimConfig
from streamrl.config.reward import RewardConfig
from streamrl.config.root import Config
from streamrl.config.task import TaskConfig, rollout_kind
from streamrl.config.transport import TransportConfig

__all__ = [
    "ActorConfig", "AdvantageConfig", "Config", "ConfigError", "DEFAULT_CONFIG", "DEFAULT_LOSS", "DifficultyConfig", "EndpointConfig",
    "EvalConfig", "Fraction", "PLUGIN_SECTIONS", "GraderConfig", "LORA_TARGETS", "LearnerConfig", "LoraConfig", "LossConfig",
    "MGRPOConfig", "ModelConfig", "MonitoringConfig", "NonNegFloat", "NonNegInt", "OptimConfig", "Port",
    "PositiveFloat", "PositiveInt", "RewardConfig", "TaskConfig", "TransportConfig", "_Section", "dump", "from_dict",
    "load", "overrides_for", "rollout_kind", "to_dict",
]
