"""Tool-call parsers, argument binding, and loading an environment plug-in."""

from __future__ import annotations

import textwrap

import pytest

from streamrl.tasks import environments, tool_calls
from streamrl.tasks.lookup import LookupEnv, LookupNoToolEnv
from streamrl.tasks.tool_calls import PARSERS, ToolCall


def test_qwen3_parser_reads_every_call_block():
    text = ('<think>\nlook both up\n</think>\n\n<tool_call>\n{"name": "lookup", "arguments": {"key": "k1"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}\n</tool_call>')
    calls = PARSERS.get("qwen3")(text, ["lookup", "add"])
    assert calls == [ToolCall("lookup", {"key": "k1"}), ToolCall("add", {"a": 1, "b": 2})]


def test_qwen3_parser_turns_unreadable_calls_into_errors_not_silence():
    calls = PARSERS.get("qwen3")('<tool_call>{"name": lookup}</tool_call><tool_call>[1]</tool_call>', ["lookup"])
    assert [c.name for c in calls] == ["", ""]
    assert "not JSON" in calls[0].error and "needs a JSON object" in calls[1].error
    assert PARSERS.get("qwen3")("the answer is b", ["lookup"]) == []


def test_words_parser_calls_a_tool_named_by_the_first_word():
    assert PARSERS.get("words")("lookup k3 x", ["lookup"]) == [ToolCall("lookup", positional=("k3", "x"))]
    assert PARSERS.get("words")("b lookup", ["lookup"]) == []
    assert tool_calls.parser_for("auto", chat=False) is PARSERS.get("words")
    assert tool_calls.parser_for("auto", chat=True) is PARSERS.get("qwen3")


def test_a_parser_name_is_checked_against_the_registry():
    with pytest.raises(ValueError) as e:
        PARSERS.register("qwen3")(lambda text, names: [])
    assert "already registered" in str(e.value)
    with pytest.raises(KeyError, match="valid: qwen3, words"):
        tool_calls.parser_for("hermes2", chat=True)


def test_bind_fills_positional_words_and_refuses_what_does_not_fit():
    def lookup(key: str) -> str:
        return key

    assert tool_calls.bind(lookup, ToolCall("lookup", positional=("k1", "extra"))) == (("k1",), {})
    assert tool_calls.bind(lookup, ToolCall("lookup", {"key": "k1"})) == ((), {"key": "k1"})
    with pytest.raises(TypeError):
        tool_calls.bind(lookup, ToolCall("lookup", {"nope": 1}))
    with pytest.raises(TypeError):
        tool_calls.bind(lookup, ToolCall("lookup", positional=()))


def test_environment_loads_from_an_entry_point_a_module_or_a_file(tmp_path):
    assert environments.load("lookup") is LookupEnv
    assert environments.load("streamrl.tasks.lookup:LookupNoToolEnv") is LookupNoToolEnv
    f = tmp_path / "my_env.py"
    f.write_text(textwrap.dedent("""
        class Echo:
            def __init__(self, row): self.row = row
            def reset(self): return [{"role": "user", "content": self.row["prompt"]}]
            def step(self, reply): return [], 1.0, True
        class NoStep:
            def reset(self): return []
    """))
    assert environments.load(f"{f}:Echo").__name__ == "Echo"
    with pytest.raises(ValueError, match="needs reset\\(\\) and step\\(reply\\); missing step"):
        environments.load(f"{f}:NoStep")
    with pytest.raises(ValueError, match="no entry point 'nope' in group 'streamrl.environments'.*lookup"):
        environments.load("nope")
    with pytest.raises(ValueError, match="has no Class 'Missing'"):
        environments.load(f"{f}:Missing")


def test_tool_schema_is_what_chat_templates_take():
    env = LookupEnv({"key": "k1", "symbol": "b"})
    s = environments.schema(env.lookup)
    assert s["type"] == "function" and s["function"]["name"] == "lookup"
    assert s["function"]["parameters"]["properties"]["key"]["type"] == "string"
    assert s["function"]["parameters"]["required"] == ["key"]

    def undocumented(n: int, flag: bool = False):
        """Counts."""

    s = environments.schema(undocumented)["function"]
    assert s["description"] == "Counts." and s["parameters"]["required"] == ["n"]
    assert s["parameters"]["properties"] == {"n": {"type": "integer"}, "flag": {"type": "boolean"}}


def test_arguments_are_converted_by_the_tools_type_hints_and_a_bad_one_is_a_type_error():
    def add(a: int, b: int) -> int:
        return a + b

    args, kwargs = tool_calls.bind(add, ToolCall("add", positional=("173", "26")))
    assert add(*args, **kwargs) == 199  # not "17326"
    assert tool_calls.bind(add, ToolCall("add", {"a": "1", "b": 2})) == ((), {"a": 1, "b": 2})

    def many(x: float, flag: bool, xs: list[int], d: dict, s: str, anything=None):
        pass

    got, _ = tool_calls.bind(many, ToolCall("many", positional=("1.5", "true", "[1, 2]", '{"k": 1}', "hi", "raw")))
    assert got == (1.5, True, [1, 2], {"k": 1}, "hi", "raw")
    with pytest.raises(TypeError, match="argument b='many' is not int"):
        tool_calls.bind(add, ToolCall("add", positional=("1", "many")))
    with pytest.raises(TypeError, match="argument xs='\\[1,' is not JSON for list\\[int\\]"):
        tool_calls.bind(many, ToolCall("many", positional=("1", "1", "[1,", "{}", "s")))
