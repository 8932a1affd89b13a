"""Prompt sources with ordinal (partial-credit) rewards, in a registry.

`base` holds what every task shares; each other module defines tasks, which `TASKS` finds through the
entry-point group `streamrl.tasks` (`plugins`; streamrl's own are declared in its pyproject.toml, a user's
package declares its own): the symbol tasks (`symbols`), the paper's pairwise code verifier (`verifier`),
math with a final answer (`math_answer`), reasoning-gym's procedural datasets (`procedural`) and any dataset with reward functions by reference (`dataset`,
reading through `data`, scoring through `reward_functions`).
"""

from streamrl.tasks.base import TASKS, Prompt, build, distinct

__all__ = ["TASKS", "Prompt", "build", "distinct"]
