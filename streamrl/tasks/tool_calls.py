"""Tool calls in a model's reply: the parsers (one per model family, in a registry) and running a call.

A parser turns a reply's text into the calls it makes (`ToolCall`: a name and its arguments) and the reply's
text without them; a reply with no call is the model's answer to the environment. `task.tool_parser` picks one:

- `qwen3` (Qwen2.5, Qwen3 and every template that follows Hermes' format): each call is
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, as those templates render them.
- `words` (the tiny word-level model, which has no template and no JSON): a reply whose first word names a
  tool calls it with the following words as its positional arguments (`lookup k3`).

Either way each argument is then converted by the tool's type hints (`typed`): `add(a: int, b: int)` called as
`add 173 26` gets 173 and 26, not two strings; a value that cannot be read as its type is a `bad_call`.

A call the parser finds but cannot read (bad JSON, no name) is still a call: it comes back with `error` set,
the model sees the error in a `tool` message, and the runner counts it (`bad_call`). `PARSERS.register(name)`
adds a parser (a function `(text, tool_names) -> list[ToolCall]`).
"""

from __future__ import annotations

import inspect
import json
import re
import typing
from typing import Any, Callable

import msgspec

from streamrl.registry import TOOL_PARSERS, Registry


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
PARSERS: Registry[Parser] = TOOL_PARSERS

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
    dropped (the word format has no way to end a call early); each argument is converted by the parameter's type
    hint (`typed`). Raises TypeError naming what does not fit."""
    signature = inspect.signature(fn)
    if not call.positional:  # keywords stay keywords
        bound = typed(fn, signature.bind(**call.arguments))
        return (), {k: bound.arguments.get(k, v) for k, v in call.arguments.items()}
    params = [p for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    bound = typed(fn, signature.bind(*call.positional[:len(params)], **call.arguments))
    return tuple(bound.args), dict(bound.kwargs)


def typed(fn: Callable, bound: inspect.BoundArguments) -> inspect.BoundArguments:
    """The bound arguments converted by fn's type hints: a word or JSON string becomes the int, float or bool the
    hint asks for ("173" → 173, "true" → True), a list or dict is read from JSON text, containers' items are
    converted too (list[int]); a parameter without a hint (or with one msgspec cannot convert to) gets the value
    as it came. Raises TypeError naming the parameter, the value and the type when a value cannot be read."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # a hint that does not resolve: the values go as they came
        hints = {}
    params = bound.signature.parameters
    for name, value in list(bound.arguments.items()):
        hint = hints.get(name)
        if hint is None or hint is typing.Any or params[name].kind in (params[name].VAR_POSITIONAL,
                                                                         params[name].VAR_KEYWORD):
            continue
        bound.arguments[name] = _convert(value, hint, name)
    return bound


def _convert(value: Any, hint: Any, name: str) -> Any:
    container = typing.get_origin(hint) or hint
    if isinstance(value, str) and container in (list, dict, tuple, set):  # the word format: JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise TypeError(f"argument {name}={value!r:.60} is not JSON for {_name(hint)}") from None
    try:
        return msgspec.convert(value, hint, strict=False)  # strict=False: "173" → 173, "true" → True
    except msgspec.ValidationError as e:
        raise TypeError(f"argument {name}={value!r:.60} is not {_name(hint)} ({e})") from None
    except TypeError:  # a type msgspec does not convert to (a class of the user's): left as it came
        return value


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", None) if typing.get_origin(hint) is None else str(hint).replace("typing.", "")


def result_text(value: Any) -> str:
    """A tool's return value as the `tool` message's content: a str as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
