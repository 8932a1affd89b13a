"""The endpoint's answers in OpenAI's shapes (streamrl.actors.replies): tool calls read out of a reply by the task's
parser, and a whole answer as the server-sent events of stream=true."""

from __future__ import annotations

import json

from streamrl.actors import replies
from streamrl.tasks.tool_calls import PARSERS

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}, "depth": {"type": "integer"}}}}}]


def test_hermes_tool_call_blocks_become_tool_calls_and_the_text_around_them_the_content():
    text = 'Let me look.\n<tool_call>\n{"name": "lookup", "arguments": {"key": "k3"}}\n</tool_call>'
    content, calls = replies.read_calls(text, TOOLS, PARSERS.get("qwen3"), "call-e-0-0")
    assert content == "Let me look."
    assert calls == [{"id": "call-e-0-0-0", "type": "function",
                      "function": {"name": "lookup", "arguments": '{"key": "k3"}'}}]
    only = '<tool_call>{"name": "lookup", "arguments": {}}</tool_call>'
    assert replies.read_calls(only, TOOLS, PARSERS.get("qwen3"), "c")[0] is None


def test_unreadable_or_undeclared_calls_stay_text():
    for text in ('<tool_call>{"name": lookup}</tool_call>',
                 '<tool_call>{"name": "search", "arguments": {}}</tool_call>'):
        assert replies.read_calls(text, TOOLS, PARSERS.get("qwen3"), "c") == (text, [])


def test_word_format_calls_name_their_words_by_the_schemas_properties_in_order():
    content, calls = replies.read_calls("lookup k3 2 extra", TOOLS, PARSERS.get("words"), "c")
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"key": "k3", "depth": "2"}
    assert replies.read_calls("a b", TOOLS, PARSERS.get("words"), "c") == ("a b", [])


def test_a_streamed_answer_is_the_whole_ones_content_then_its_ids_then_done():
    choices = [replies.Choice([5, 6, 2], [-0.1, -0.2, -0.3], "lookup k3", "stop"),
               replies.Choice([7, 2], [-0.5, -0.6], "b", "length")]
    body = {"model": "policy", "stream": True, "stream_options": {"include_usage": True}}
    whole = replies.payload("chat", body, "e-0", [1, 2], choices, 4, str, TOOLS, PARSERS.get("words"))
    assert whole["choices"][0]["finish_reason"] == "tool_calls" and whole["choices"][1]["finish_reason"] == "length"
    raw = replies.stream("chat", body, whole).decode()
    assert raw.endswith("data: [DONE]\n\n")
    events = [json.loads(x[len("data: "):]) for x in raw.split("\n\n") if x.startswith("data: {")]
    assert [e["object"] for e in events] == ["chat.completion.chunk"] * 5
    first, last0, first1, last1, usage = events
    assert first["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "lookup"
    assert last0["choices"][0]["token_ids"] == [5, 6, 2] and last0["prompt_token_ids"] == [1, 2]
    assert last0["policy_version"] == 4 and "prompt_token_ids" not in last1
    assert first1["choices"][0]["delta"]["content"] == "b" and last1["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
