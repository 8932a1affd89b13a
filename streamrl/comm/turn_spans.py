"""An episode's turns: who wrote each part of a sample's completion, and how many tokens it is.

The texts never travel: the learner decodes each turn's text from the completion tokens it already holds, and only
when it logs the sample (`log.samples_every`). On the wire a sample's turns are flat numbers, two a turn (its role's
code, its tokens: `wire.SampleInfo.turn_layout`), and the tools of its tool turns in order (`turn_tools`),
checked where they are used (`unpack`, at the steps the learner logs), not on every group received: training never
reads them.
"""

from __future__ import annotations

from typing import Literal

from msgspec import Struct

ROLES = ("model", "environment", "tool")
"""model: tokens the model sampled; environment: what the environment, the agent's own messages or the chat
template added; tool: tool results (the template's markers around them included). A role's code is its index."""


class TurnSpan(Struct, frozen=True):
    """One turn of an episode's completion, in order: its role and how many of the completion's tokens it is."""

    role: Literal["model", "environment", "tool"]
    tokens: int
    tools: tuple[str, ...] = ()
    """A tool turn: the tools whose results it holds, one per call answered, in order."""


def pack(spans: list[TurnSpan]) -> dict:
    """wire.SampleInfo's turn_layout ([role code, tokens] per turn, flat) and turn_tools (each tool turn's tools, in
    order; None: no tool turn) of a sample's turns."""
    layout = [n for t in spans for n in (ROLES.index(t.role), t.tokens)]
    tools = [list(t.tools) for t in spans if t.role == "tool"]
    return {"turn_layout": layout, "turn_tools": tools or None}


def unpack(layout: list[int], tools: list[list[str]] | None, num_tokens: int) -> list[TurnSpan]:
    """A sample's turns from the wire's (layout, tools); ValueError saying what is wrong (`problem`) when they do not
    fit its `num_tokens` tokens."""
    if why := problem(layout, tools, num_tokens):
        raise ValueError(why)
    named = iter(tools or [])
    return [TurnSpan(ROLES[code], n, tuple(next(named, ())) if code == _TOOL else ())
            for code, n in zip(layout[::2], layout[1::2])]


def problem(layout: list[int], tools: list[list[str]] | None, num_tokens: int) -> str | None:
    """What is wrong with a sample's turns on the wire (None: nothing): pairs of a role code and a token count,
    adding up to the sample's tokens, and no more tools' lists than tool turns."""
    if len(layout) % 2 or (layout and max(layout[::2]) >= len(ROLES)):
        return f"turn layout {layout[:8]}: need [role code 0-{len(ROLES) - 1}, tokens] pairs"
    if (held := sum(layout[1::2])) != num_tokens:
        return f"its turns hold {held} tokens, its completion {num_tokens}"
    if tools and len(tools) > (n := layout[::2].count(_TOOL)):
        return f"{len(tools)} tool turns' tools for {n} tool turns"
    return None


_TOOL = ROLES.index("tool")
