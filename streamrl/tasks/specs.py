"""streamrl's own tasks as plug-ins: each one's options (`options`) and what it is (capability flags), declared
without importing the task (the entry points of group `streamrl.tasks` name these; pyproject.toml)."""

from __future__ import annotations

from streamrl.registry import Plugin
from streamrl.tasks import options as o

ROWS = {"rows", "declared_levels"}  # a task over the user's rows, whose reward scale the config declares

COPY = Plugin(load="streamrl.tasks.symbols:Copy", options=o.SymbolOptions)
REVERSE = Plugin(load="streamrl.tasks.symbols:Reverse", options=o.SymbolOptions)
REPEAT_FIRST = Plugin(load="streamrl.tasks.symbols:RepeatFirst", options=o.SymbolOptions)
CODE_VERIFIER = Plugin(load="streamrl.tasks.verifier:CodeVerifier", options=o.VerifierOptions)
MATH = Plugin(load="streamrl.tasks.math_answer:MathAnswer", options=o.MathOptions)
DATASET = Plugin(load="streamrl.tasks.dataset:DatasetTask", options=o.DatasetOptions,
                 capabilities=ROWS | {"reward_functions"})
REASONING_GYM = Plugin(load="streamrl.tasks.procedural:ReasoningGym", options=o.ReasoningGymOptions)
LOOKUP = Plugin(load="streamrl.tasks.lookup:Lookup", options=o.LookupOptions)
AGENT = Plugin(load="streamrl.tasks.agent:AgentTask", options=o.RowsOptions, capabilities=ROWS | {"agent_rollout"})
SKYRL_GYM = Plugin(load="streamrl.tasks.skyrl_adapter:SkyRLGymTask", options=o.SkyRLOptions,
                   capabilities=ROWS | {"episodes", "names_environment"})
OPENENV = Plugin(load="streamrl.tasks.openenv_adapter:OpenEnvTask", options=o.OpenEnvOptions,
                 capabilities=ROWS | {"episodes"})
VERIFIERS = Plugin(load="streamrl.tasks.verifiers_env:VerifiersTask", options=o.VerifiersOptions,
                   capabilities={"declared_levels", "agent_rollout"})
