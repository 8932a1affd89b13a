"""Prompt text → the token ids a model expects, and how many tokens a completion may add to them.

An instruct release was trained on its chat format, so a prompt goes in (as one user turn, or as the chat
messages a dataset row holds, system message included) through
the tokenizer's chat template (`model.chat_template`: auto uses it when the tokenizer has one),
with the generation prompt appended and Qwen3's thinking switch passed through
(`model.enable_thinking`). The length cap is on the whole sequence: a completion may add
min(actors.max_new_tokens, model.max_seq_len - prompt tokens), model.max_seq_len unset meaning the model's
positions (`streamrl.models.context`); a prompt that leaves no room, or is longer than
`model.max_prompt_tokens`, is skipped by the caller and counted (actors, `streamrl difficulty`).
"""

from __future__ import annotations

from streamrl.config import Config
from streamrl.models.context import seq_cap
from streamrl.tasks.base import render


def uses_chat_template(tokenizer, mode: str) -> bool:
    """mode: auto | on | off (model.chat_template). on without a template is a one-line error."""
    has = bool(getattr(tokenizer, "chat_template", None))
    if mode == "on" and not has:
        raise ValueError("model.chat_template=on: the tokenizer has no chat template; use auto or off")
    return has if mode == "auto" else mode == "on"


def content(prompt) -> str | list[dict]:
    """What a prompt encodes from: a task `Prompt`'s chat messages where it has them, else its text (a str
    stays itself)."""
    if isinstance(prompt, str):
        return prompt
    return list(prompt.messages) if getattr(prompt, "messages", ()) else prompt.text


def encode(tokenizer, text: str | list[dict], chat: bool, enable_thinking: bool | None = None) -> list[int]:
    """Token ids of `text` (or of chat messages, {"role", "content"} each, a system message allowed): raw, or
    (chat) through the chat template (a text as one user turn) followed by the assistant's generation prompt."""
    if chat:
        extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        messages = [{"role": "user", "content": text}] if isinstance(text, str) else list(text)
        # Rendered to text, then tokenized without added specials: the template already holds every
        # marker, and this is what vLLM and SGLang do with a chat request.
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
    elif not isinstance(text, str):
        text = render(text)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def room(prompt_tokens: int, max_new_tokens: int, max_seq_len: int | None, max_prompt_tokens: int | None = None) -> int:
    """Completion tokens allowed after a prompt of this length (≤ 0: the prompt leaves no room, or is longer than
    max_prompt_tokens: skip it)."""
    if max_prompt_tokens is not None and prompt_tokens > max_prompt_tokens:
        return 0
    return max_new_tokens if max_seq_len is None else min(max_new_tokens, max_seq_len - prompt_tokens)


class PromptEncoder:
    """The encoding a config asks for, resolved once against its tokenizer."""

    def __init__(self, tokenizer, model_cfg, max_new_tokens: int):
        self.tokenizer = tokenizer
        self.chat = uses_chat_template(tokenizer, model_cfg.chat_template)
        self.enable_thinking = model_cfg.enable_thinking
        self.max_new_tokens, self.max_seq_len = max_new_tokens, seq_cap(model_cfg)
        self.max_prompt_tokens = getattr(model_cfg, "max_prompt_tokens", None)

    @classmethod
    def from_config(cls, cfg: Config, tokenizer) -> "PromptEncoder":
        return cls(tokenizer, cfg.model, cfg.actors.max_new_tokens)

    def __call__(self, text) -> list[int]:
        """A text, chat messages, or a task Prompt (its messages where it has them)."""
        return encode(self.tokenizer, content(text), self.chat, self.enable_thinking)

    def room(self, ids: list[int]) -> int:
        return room(len(ids), self.max_new_tokens, self.max_seq_len, self.max_prompt_tokens)
