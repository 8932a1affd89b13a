"""Tool calls in a model's reply: the parsers (one per model family, in a registry) and running a call.

A parser turns a reply's text into the calls it makes (`ToolCall`: a name and its arguments) and the reply's
text without them; a reply with no call is the model's answer to the environment. `task.tool_parser` picks one:

- `qwen3` (Qwen2.5, Qwen3 and every template that follows Hermes' format): each call is
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, as those templates render them.
- `words` (the tiny word-level model, which has no template and no JSON): a reply whose first word names a
  tool calls it with the following words as its positional arguments (`lookup k3`).

A call the parser finds but cannot read (bad JSON, no name) is still a call: it comes back with `error` set,
the model sees the error in a `tool` message, and the runner counts it (`bad_call`). `PARSERS.register(name)`
adds a parser (a function `(text, tool_names) -> list[ToolCall]`).
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any, Callable

import msgspec

from streamrl.registry import Registry


class ToolCall(msgspec.Struct, frozen=True):
    name: str
    """The tool's name as the model wrote it."""
    arguments: dict = {}
    """Keyword arguments (JSON formats)."""
    positional: tuple = ()
    """Positional arguments (the word format)."""
    error: str | None = None
    """Why the call could not be read (it is not run; the model is told)."""


Parser = Callable[[str, "list[str]"], "list[ToolCall]"]
PARSERS: Registry[Parser] = Registry("tool-call parser")

_QWEN3 = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@PARSERS.register("qwen3")
def qwen3(text: str, tool_names: list[str]) -> list[ToolCall]:
    """Every `<tool_call>{json}</tool_call>` block in the reply (Hermes' format, as Qwen's templates render it)."""
    calls = []
    for body in _QWEN3.findall(text):
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            calls.append(ToolCall(name="", error=f"the tool call is not JSON ({e.msg} at {e.pos}): {body[:80]!r}"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            calls.append(ToolCall(name="", error=f"a tool call needs a JSON object with a 'name': {body[:80]!r}"))
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        if not isinstance(args, dict):
            calls.append(ToolCall(name=obj["name"], error=f"'arguments' must be a JSON object, got {args!r:.80}"))
            continue
        calls.append(ToolCall(name=obj["name"], arguments=args))
    return calls


@PARSERS.register("words")
def words(text: str, tool_names: list[str]) -> list[ToolCall]:
    """One call when the reply's first word is a tool's name: the words after it are its positional arguments."""
    parts = text.split()
    if not parts or parts[0] not in tool_names:
        return []
    return [ToolCall(name=parts[0], positional=tuple(parts[1:]))]


def parser_for(name: str, chat: bool) -> Parser:
    """task.tool_parser: a registered name, or auto (qwen3 under a chat template, words without one)."""
    if name == "auto":
        name = "qwen3" if chat else "words"
    return PARSERS.get(name)


def bind(fn: Callable, call: ToolCall) -> tuple[tuple, dict]:
    """(args, kwargs) for `fn` from a call: positional words fill its parameters in order, extra words are
    dropped (the word format has no way to end a call early). Raises TypeError naming what does not fit."""
    if not call.positional:
        inspect.signature(fn).bind(**call.arguments)
        return (), dict(call.arguments)
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    args = call.positional[:len(params)]
    inspect.signature(fn).bind(*args, **call.arguments)
    return tuple(args), dict(call.arguments)


def result_text(value: Any) -> str:
    """A tool's return value as the `tool` message's content: a str as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
