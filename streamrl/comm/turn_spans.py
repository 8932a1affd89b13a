"""An episode's turns on the wire: who wrote each part of a sample's completion, and how many tokens it is.

The texts never travel: the learner decodes each turn's text from the completion tokens it already holds, and only
when it logs the sample (`log.samples_every`), so an episode's turns cost a few bytes a turn on every group rather
than a second copy of its text.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct

ROLES = ("model", "environment", "tool")
"""model: tokens the model sampled; environment: what the environment, the agent's own messages or the chat
template added; tool: tool results (the template's markers around them included)."""


class TurnSpan(Struct, array_like=True, frozen=True):
    """One turn of an episode's completion, in order: its role and how many of the completion's tokens it is."""

    role: Literal["model", "environment", "tool"]
    tokens: Annotated[int, Meta(ge=0)]
    tools: tuple[str, ...] = ()
    """A tool turn: the tools whose results it holds, one per call answered, in order."""
