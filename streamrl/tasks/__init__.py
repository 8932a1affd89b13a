"""Prompt sources with ordinal (partial-credit) rewards, in a registry.

`base` holds what every task shares; each other module defines tasks and registers them in `TASKS`
on import, which this package does for all of them: the symbol tasks (`symbols`), the paper's pairwise
code verifier (`verifier`), math with a final answer (`math_answer`) and reasoning-gym's procedural
datasets (`procedural`).
"""

from streamrl.tasks import math_answer, procedural, symbols, verifier  # noqa: F401  (registers the tasks)
from streamrl.tasks.base import TASKS, Prompt, build, distinct

__all__ = ["TASKS", "Prompt", "build", "distinct"]
