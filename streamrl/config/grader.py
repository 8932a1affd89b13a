"""The `grader` section: the OpenAI-compatible endpoint the rubric reward asks for scores."""

from __future__ import annotations

import string
from typing import Annotated, Literal

from msgspec import Meta

from streamrl.config.base import PositiveInt, NonNegInt, PositiveFloat, NonNegFloat, _Section


class GraderConfig(_Section):
    base_url: str = "http://127.0.0.1:8000/v1"
    """The rubric grader's OpenAI-compatible endpoint (up to /v1): vLLM, SGLang, llama.cpp, a hosted API."""
    model: str = "default"
    """Model name sent with every request (the name the server serves, e.g. `vllm serve --served-model-name`)."""
    api_key_env: str | None = None
    """Environment variable holding the API key (never the key itself in a config); null: no key ("EMPTY")."""
    template: str = ("Rate the response to the prompt on a scale of 1 to {scale} ({scale} is best). Answer with the "
                     "number only.\n\nPrompt:\n{prompt}\n\nResponse:\n{completion}\n\nScore:")
    """Rubric sent as the user turn: {prompt}, {completion}, {scale} and any column of the row ({name})."""
    system: str | None = None
    """Optional system message for the grader (null: none)."""
    scale: Annotated[int, Meta(ge=2, le=100)] = 10
    """The rubric's scale 1..scale; a score s becomes the level (s-1)/(scale-1) in [0, 1]."""
    constrain: Literal["auto", "choice", "none"] = "auto"
    """choice: vLLM structured outputs allow only "1".."scale"; auto: the same, dropped on a 400; none: never sent."""
    concurrency: PositiveInt = 8
    """Requests in flight at once, over every call of the grader in a process."""
    timeout_s: PositiveFloat = 30.0
    """Per-request HTTP timeout (connect and read)."""
    retries: NonNegInt = 2
    """Extra attempts after a timeout, a refused connection or a 5xx/429 (not after an unparseable answer)."""
    backoff_s: NonNegFloat = 0.5
    """Wait before retry k (k = 1, 2, ...): backoff_s * 2**(k-1)."""
    max_tokens: PositiveInt = 8
    """Completion tokens the grader may write (the score and a little slack)."""
    temperature: NonNegFloat = 0.0
    """Grader sampling temperature (0: greedy, the same answer for the same request)."""

    def __post_init__(self) -> None:
        check_template(self.template)


def check_template(template: str) -> None:
    """Raises ValueError unless `template` is a valid format string naming {completion}."""
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as e:
        raise ValueError(f"grader.template: not a format string ({e}); write literal braces as {{{{ }}}}") from None
    if "completion" not in fields:
        raise ValueError("grader.template: must contain {completion} (fields: {prompt}, {completion}, {scale}, "
                         "and any column of the row)")
    if any(not f.isidentifier() for f in fields):
        bad = sorted(f for f in fields if not f.isidentifier())
        raise ValueError(f"grader.template: fields {bad} are not plain names (allowed: {{prompt}}, {{completion}}, "
                         "{scale}, or a column name)")
