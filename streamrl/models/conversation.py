"""A multi-turn episode's conversation and its token ids, token in, token out.

The model's own tokens are never re-tokenised: an episode holds the ids it has (the opening prompt, the model's
sampled replies, the environment's rendered turns) and each new turn only appends. What the environment adds
(tool results, its messages, the template's turn markers and the next generation prompt) is rendered as the
chat template would render the whole conversation, and the ids appended are that rendering's suffix after what
is held: at token level when the template's tokenisation of the conversation starts with the held ids, else at
text level when its text starts with the held ids' text (the model's tokens were not the canonical
tokenisation of the same text). Where neither holds, the template renders a past turn differently from the
tokens held (Qwen3 drops an empty `<think></think>` from past assistant turns, and may re-space a kept one):
the held ids stay as they are, the new turns are appended as rendered after that turn, and the turn counts as
template drift (`Conversation.drift`), never silently.

Without a chat template (the tiny word-level model) the conversation renders as `streamrl.tasks.base.render`
does a prompt, each message's content on its own line, with the tools' names on the first line and each
assistant turn closed by the end token, so a reply the model ended itself matches the held ids exactly.
"""

from __future__ import annotations

import os

from streamrl.models.prompting import uses_chat_template


class Renderer:
    """A tokenizer's rendering of conversations (with tools) to text and ids, resolved once per run."""

    def __init__(self, tokenizer, chat_template: str = "auto", enable_thinking: bool | None = None,
                 tools: list[dict] | None = None):
        """chat_template: model.chat_template (auto | on | off); tools: the tools' JSON schemas (None: none)."""
        self.tokenizer = tokenizer
        self.chat = uses_chat_template(tokenizer, chat_template)
        self.extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        self.tools = tools or None
        self.eos_text = getattr(tokenizer, "eos_token", None) or ""

    def text(self, messages: list[dict], generation_prompt: bool) -> str:
        if self.chat:
            return self.tokenizer.apply_chat_template(messages, tools=self.tools, tokenize=False,
                                                      add_generation_prompt=generation_prompt, **self.extra)
        lines = [" ".join(t["function"]["name"] for t in self.tools)] if self.tools else []
        for m in messages:
            lines.append(m["content"] + (f" {self.eos_text}" if m["role"] == "assistant" else ""))
        return "\n".join(lines) + ("\n" if generation_prompt and lines else "")

    def ids(self, text: str) -> list[int]:
        # Rendered to text, then tokenized without added specials: the template already holds every marker.
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


class Conversation:
    """One episode: its messages, the ids held (opening prompt, then completion), and which ids the model
    sampled. `ids[prompt_len:]` is the sample's completion; `model_mask` and `logprobs` align with it."""

    def __init__(self, renderer: Renderer, opening: list[dict]):
        self.r = renderer
        self.messages = list(opening)
        prompt = renderer.ids(renderer.text(self.messages, generation_prompt=True))
        self.ids: list[int] = list(prompt)
        self.prompt_len = len(prompt)
        self.model_mask: list[bool] = []
        self.logprobs: list[float] = []
        self.drift = 0
        """Turns whose rendering disagreed with the held ids (see the module docstring)."""
        self.spans: list[list] = []
        """The completion's turns in order, each [role, tokens, tools] (streamrl.comm.turn_spans: model,
        environment or tool; tools: a tool turn's tools), their tokens adding up to the completion's."""

    @classmethod
    def of_ids(cls, renderer: Renderer, ids: list[int]) -> "Conversation":
        """An episode opened by token ids (a plain completion request) rather than by messages."""
        conv = cls.__new__(cls)
        conv.r, conv.messages, conv.ids, conv.prompt_len = renderer, [], list(ids), len(ids)
        conv.model_mask, conv.logprobs, conv.drift, conv.spans = [], [], 0, []
        return conv

    def extend_to(self, ids: list[int] | None, text: str | None = None) -> bool:
        """A request's whole prompt (ids, or text) that extends the held ids: its new part is appended as the
        environment's. False (nothing appended) when it does not start with what is held."""
        if ids is not None and ids[:len(self.ids)] == self.ids:
            self._append(ids[len(self.ids):], False)
            return True
        held = self.r.decode(self.ids)
        if text is not None and text.startswith(held):
            self._append(self.r.ids(text[len(held):]), False)
            return True
        return False

    @property
    def completion(self) -> list[int]:
        return self.ids[self.prompt_len:]

    def add_reply(self, tokens: list[int], logprobs: list[float], end_ids: set[int]) -> str:
        """The model's sampled reply: its ids held as they are; its message holds their text (without a final end
        token, which the template adds back). Returns the reply's text without special tokens."""
        self._append(tokens, True, logprobs)
        body = tokens[:-1] if tokens and tokens[-1] in end_ids else tokens
        self.messages.append({"role": "assistant", "content": self.r.decode(body)})
        return self.r.decode(body, skip_special_tokens=True)

    def add_messages(self, new: list[dict], tools: list[str] | None = None) -> int:
        """The environment's messages (tool results, its reply), rendered with the next generation prompt: a tool
        turn when all are tool results (`tools`: their tools, where the messages do not name them), else the
        environment's. Returns how many ids were appended."""
        before = self.messages
        self.messages = [*before, *new]
        full = self.r.text(self.messages, generation_prompt=True)
        suffix = self._suffix(full, before)
        tool_turn = bool(new) and all(m.get("role") == "tool" for m in new)
        names = tools or [str(m.get("name") or "?") for m in new]
        self._append(suffix, False, role="tool" if tool_turn else "environment", tools=names if tool_turn else ())
        return len(suffix)

    def _suffix(self, full: str, before: list[dict]) -> list[int]:
        full_ids = self.r.ids(full)
        if full_ids[:len(self.ids)] == self.ids:
            return full_ids[len(self.ids):]
        held = self.r.decode(self.ids)
        if full.startswith(held):
            return self.r.ids(full[len(held):])
        self.drift += 1
        prev = self.r.text(before, generation_prompt=False)
        new = full[len(os.path.commonprefix([prev, full])):]
        # What the template puts after the last reply's text (its end marker and newline), less the end token
        # the model sampled itself.
        reply = before[-1]["content"] if before and before[-1]["role"] == "assistant" else ""
        at = prev.rfind(reply) if reply else -1
        close = prev[at + len(reply):] if at >= 0 else ""
        if held.endswith(self.r.eos_text) and close.startswith(self.r.eos_text):
            close = close[len(self.r.eos_text):]
        return self.r.ids(close + new)

    def cut(self, length: int) -> int:
        """Drop held ids past `length` (never into the opening prompt). Returns how many were dropped."""
        length = max(length, self.prompt_len)
        dropped = max(0, len(self.ids) - length)
        del self.ids[length:], self.model_mask[length - self.prompt_len:], self.logprobs[length - self.prompt_len:]
        left = dropped
        while left and self.spans:  # the turns lose their last ids too
            take = min(left, self.spans[-1][1])
            self.spans[-1][1] -= take
            left -= take
            if not self.spans[-1][1]:
                self.spans.pop()
        return dropped

    def _append(self, ids: list[int], model: bool, logprobs: list[float] | None = None, role: str = "environment",
                tools=()) -> None:
        if ids:
            self.spans.append(["model" if model else role, len(ids), tuple(tools)])
        self.ids.extend(ids)
        self.model_mask.extend([model] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))

    def matches_template(self) -> bool:
        """Whether the held ids are the template's rendering of the conversation so far (its ids, or its text)."""
        full = self.r.text(self.messages, generation_prompt=False)
        return self.r.ids(full)[:len(self.ids)] == self.ids or full.startswith(self.r.decode(self.ids))
