"""The endpoint's answers in OpenAI's shapes: a model turn's choices as a chat.completion or text_completion
(with vLLM's token-id extensions), the model's tool calls read out of its reply, and the stream of chunks a
`stream: true` request gets.

Tool calls: when a chat request declares `tools`, each choice's text goes through the task's tool parser
(`task.tool_parser`: qwen3's `<tool_call>{json}</tool_call>` blocks under a chat template, the word format
without one; `streamrl.tasks.tool_calls`), and the calls it finds become the message's `tool_calls` (OpenAI's
`{"id", "type": "function", "function": {"name", "arguments": json}}`), its content the text around them (None
when nothing is left) and the choice's finish_reason `tool_calls`. A word-format call's positional words are
named by the tool's JSON-schema `properties`, in order. A call the parser cannot read stays text.

Streaming: the turn is sampled whole (one batched generate call), then sent as server-sent events: a chunk per
choice with the role and all its content (and tool calls), a final chunk per choice with its finish_reason and
`token_ids` (the first also carries `prompt_token_ids` and `policy_version`), a usage chunk when
`stream_options.include_usage`, then `data: [DONE]`.
"""

from __future__ import annotations

import json
import re
import time

import msgspec

from streamrl.tasks.tool_calls import ToolCall

_QWEN3_BLOCK = re.compile(r"\s*<tool_call>.*?</tool_call>\s*", re.DOTALL)


class Choice(msgspec.Struct):
    """One sampled completion of a turn: its ids, their log-probs, its text (special tokens dropped)."""

    tokens: list[int]
    logprobs: list[float]
    text: str
    finish: str


def tool_names(tools: list[dict] | None) -> list[str]:
    return [t["function"]["name"] for t in tools or []]


def read_calls(text: str, tools: list[dict], parser, call_id: str) -> tuple[str | None, list[dict]]:
    """(the content left, OpenAI tool_calls) of a reply; no calls: (text, [])."""
    calls = [c for c in parser(text, tool_names(tools)) if c.error is None and c.name in tool_names(tools)]
    if not calls:
        return text, []
    out = [{"id": f"{call_id}-{i}", "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(_arguments(c, tools))}} for i, c in enumerate(calls)]
    if calls[0].positional or (text.split() and text.split()[0] == calls[0].name):  # the word format: all call
        return None, out
    left = _QWEN3_BLOCK.sub(" ", text).strip()
    return left or None, out


def _arguments(call: ToolCall, tools: list[dict]) -> dict:
    if not call.positional:
        return dict(call.arguments)
    schema = next(t["function"] for t in tools if t["function"]["name"] == call.name)
    names = list((schema.get("parameters") or {}).get("properties") or {})
    return {**dict(zip(names, call.positional)), **call.arguments}


def payload(kind: str, body: dict, call_id: str, prompt_ids: list[int], choices: list[Choice], version: int,
            decode, tools: list[dict] | None = None, parser=None) -> dict:
    """The whole response of a turn (kind 'chat' | 'completion'); decode(id) names a token."""
    as_ids = bool(body.get("return_tokens_as_token_ids"))
    completion_tokens = sum(len(c.tokens) for c in choices)
    usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": completion_tokens,
             "total_tokens": len(prompt_ids) + completion_tokens}
    common = {"id": call_id, "created": int(time.time()), "model": body.get("model", "policy"), "usage": usage,
              "prompt_token_ids": prompt_ids, "policy_version": version}
    out = []
    for i, c in enumerate(choices):
        names = [f"token_id:{t}" if as_ids else decode(t) for t in c.tokens]
        finish = "length" if c.finish == "length" else "stop"
        if kind == "chat":
            lp = {"content": [{"token": n, "logprob": p, "bytes": None, "top_logprobs": []}
                              for n, p in zip(names, c.logprobs)]} if body.get("logprobs") else None
            content, calls = read_calls(c.text, tools, parser, f"call-{call_id}-{i}") if tools else (c.text, [])
            message = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
                finish = "tool_calls"
            out.append({"index": i, "message": message, "finish_reason": finish, "logprobs": lp,
                        "token_ids": c.tokens})
        else:
            lp = {"tokens": names, "token_logprobs": c.logprobs, "top_logprobs": None, "text_offset": []} \
                if body.get("logprobs") is not None else None
            out.append({"index": i, "text": c.text, "finish_reason": finish, "logprobs": lp, "token_ids": c.tokens})
    return {**common, "object": "chat.completion" if kind == "chat" else "text_completion", "choices": out}


def stream(kind: str, body: dict, whole: dict) -> bytes:
    """A whole response (`payload`) as the server-sent events of `stream: true`."""
    head = {k: whole[k] for k in ("id", "created", "model")}
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    events = []
    for c in whole["choices"]:
        if kind == "chat":
            delta = {"role": "assistant", "content": c["message"]["content"]}
            if "tool_calls" in c["message"]:
                delta["tool_calls"] = [{"index": j, **t} for j, t in enumerate(c["message"]["tool_calls"])]
            first = {"index": c["index"], "delta": delta, "logprobs": c["logprobs"], "finish_reason": None}
            last = {"index": c["index"], "delta": {}, "logprobs": None, "finish_reason": c["finish_reason"]}
        else:
            first = {"index": c["index"], "text": c["text"], "logprobs": c["logprobs"], "finish_reason": None}
            last = {"index": c["index"], "text": "", "logprobs": None, "finish_reason": c["finish_reason"]}
        events.append({**head, "object": obj, "choices": [first]})
        extra = {"prompt_token_ids": whole["prompt_token_ids"], "policy_version": whole["policy_version"]} \
            if c["index"] == 0 else {}
        events.append({**head, "object": obj, "choices": [{**last, "token_ids": c["token_ids"]}], **extra})
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append({**head, "object": obj, "choices": [], "usage": whole["usage"]})
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
