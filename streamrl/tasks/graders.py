"""A rubric grader: an OpenAI-compatible model scores each completion 1..N, and the score is an ordinal level.

`rubric(prompts, completions, **columns)` has TRL's reward signature (called once per group; prompts and
completions are strings or chat-message lists, each column a list with one value per sample) and returns one
level per sample in [0, 1], (s - 1) / (N - 1), or None where the grader could not score it. `grade(cfg, ...)`
does the same with an explicit `GraderConfig` (the `grader` config section).

Every request goes to `grader.base_url`'s /chat/completions with the rubric template filled in as the user turn.
Where the server is vLLM, the answer is constrained to the strings "1".."N" by its structured outputs
(`extra_body={"structured_outputs": {"choice": [...]}}`, vLLM >= 0.12; `constrain: auto` drops the field for good
if a server answers it with 400). The reply is then parsed strictly (a bare integer in 1..N, optionally written
"Score: 7" or "7/10"); anything else is `unparseable`. A timeout, a refused connection or a 5xx/429 is retried
`grader.retries` times with exponential backoff, then the sample gets None and the failure is counted by reason
(`Grader.failures`: timeout, connection, http_<status>, unparseable). Nothing is cached between requests but
the HTTP connection pool, so a server that goes away and comes back is used again as soon as it answers.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from streamrl.config import GraderConfig

log = logging.getLogger(__name__)

FAILURE_REASONS = ("timeout", "connection", "unparseable")
"""Reasons a sample gets None (plus http_<status> for an HTTP error the server answered with)."""

class Graded(list):
    """A grader's levels (a plain list to TRL), with `failed`: each sample's failure reason (None: graded) and
    `where`: the grader it asked. The failure window (streamrl.tasks.reward_health) reads them: a grader failing on
    most samples (a server down past its retries, a judge that never answers on the scale) stops the run."""

    def __init__(self, levels, failed: list[str | None], where: str):
        super().__init__(levels)
        self.failed, self.where = failed, where


_THINK = re.compile(r"^\s*<think>.*?</think>", re.DOTALL)


def as_text(value: Any) -> str:
    """A prompt or completion as the grader reads it: a string as is; chat messages one `role: content` per line
    (a completion of one assistant message: just its content)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        value = [value]
    if isinstance(value, (list, tuple)) and all(isinstance(m, dict) and "content" in m for m in value):
        if len(value) == 1 and value[0].get("role", "assistant") == "assistant":
            return str(value[0]["content"])
        return "\n".join(f"{m.get('role', 'user')}: {m['content']}" for m in value)
    raise TypeError(f"grader: a prompt/completion is a string or a list of chat messages ({{role, content}}), "
                    f"not {type(value).__name__}")


def parse_score(text: str, scale: int) -> int | None:
    """The integer score in 1..scale the reply states, or None: strictly a number alone, `Score: n`, or `n/scale`
    (after an optional <think>...</think> block); anything else, or a number off the scale, is None."""
    text = _THINK.sub("", text).strip().rstrip(".").strip()
    m = re.fullmatch(r"(?:score\s*[:=]?\s*)?(\d{1,3})(?:\s*/\s*(\d{1,3}))?", text, re.IGNORECASE)
    if not m or (m.group(2) is not None and int(m.group(2)) != scale):
        return None
    s = int(m.group(1))
    return s if 1 <= s <= scale else None


def levels(scale: int) -> list[float]:
    """The levels a 1..scale rubric maps onto: (s - 1) / (scale - 1)."""
    return [(s - 1) / (scale - 1) for s in range(1, scale + 1)]


class Grader:
    """One endpoint's grader: a bounded pool of requests (`cfg.concurrency`), counted failures, latencies."""

    def __init__(self, cfg: GraderConfig):
        self.cfg = cfg  # its template checked where the config was read (config.grader.check_template)
        self.choices = [str(s) for s in range(1, cfg.scale + 1)]
        self.constrain = cfg.constrain != "none"
        self.failures: Counter[str] = Counter()
        self.scored = 0
        self.requests = 0
        self.latencies: list[float] = []  # seconds per successful request, for rates and percentiles
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="grader")
        self._client = None

    @property
    def client(self):
        with self._lock:
            if self._client is None:
                self._client = self._make_client()
        return self._client

    def _make_client(self):
        import openai  # heavy: only a run that grades pays for it

        key = os.environ.get(self.cfg.api_key_env, "") if self.cfg.api_key_env else ""
        if self.cfg.api_key_env and not key:
            raise ValueError(f"grader.api_key_env={self.cfg.api_key_env!r}: that environment variable is unset")
        # Retries are ours (counted, with our backoff); the client's own would hide failures.
        return openai.OpenAI(base_url=self.cfg.base_url, api_key=key or "EMPTY", timeout=self.cfg.timeout_s,
                             max_retries=0)

    def __call__(self, prompts: Sequence, completions: Sequence, **columns) -> list[float | None]:
        if len(prompts) != len(completions):
            raise ValueError(f"grader: {len(prompts)} prompts but {len(completions)} completions")
        for name, col in columns.items():
            if not isinstance(col, (list, tuple)) or len(col) != len(completions):
                raise ValueError(f"grader: column {name!r} must be a list with one value per completion "
                                 f"({len(completions)})")
        texts = [self.render(p, c, {k: v[i] for k, v in columns.items()})
                 for i, (p, c) in enumerate(zip(prompts, completions))]
        graded = list(self._pool.map(self._grade, texts))
        return Graded([s for s, _ in graded], [why for _, why in graded],
                      f"{self.cfg.model} at {self.cfg.base_url} ({self.cfg.retries} retries)")

    def render(self, prompt, completion, row: dict) -> str:
        fields = {**row, "prompt": as_text(prompt), "completion": as_text(completion), "scale": self.cfg.scale}
        try:
            return self.cfg.template.format_map(fields)
        except KeyError as e:
            raise ValueError(f"grader.template names {{{e.args[0]}}}, which this row lacks (has: "
                             f"{', '.join(sorted(fields))})") from None

    def grade_one(self, text: str) -> float | None:
        """The level of one filled-in rubric, or None (the reason counted)."""
        return self._grade(text)[0]

    def _grade(self, text: str) -> tuple[float | None, str | None]:
        """(the level, None) or (None, why: a FAILURE_REASONS or http_<status>), the reason counted."""
        import openai

        messages = ([{"role": "system", "content": self.cfg.system}] if self.cfg.system else []) + \
            [{"role": "user", "content": text}]
        attempt = 0
        while True:
            constrained = self.constrain
            extra = {"structured_outputs": {"choice": self.choices}} if constrained else None
            t0 = time.monotonic()
            try:
                with self._lock:
                    self.requests += 1
                reply = self.client.chat.completions.create(
                    model=self.cfg.model, messages=messages, max_tokens=self.cfg.max_tokens,
                    temperature=self.cfg.temperature, extra_body=extra)
            except openai.APITimeoutError:  # a subclass of APIConnectionError: test it first
                reason, retry = "timeout", True
            except openai.APIConnectionError:
                reason, retry = "connection", True
            except openai.APIStatusError as e:
                if e.status_code == 400 and constrained and self.cfg.constrain == "auto":
                    log.warning("grader: %s refused structured outputs (%s); parsing unconstrained answers from now on",
                                self.cfg.base_url, str(e)[:200])
                    self.constrain = False
                    continue  # the same attempt again, unconstrained
                else:
                    reason, retry = f"http_{e.status_code}", e.status_code == 429 or e.status_code >= 500
            else:
                elapsed = time.monotonic() - t0
                content = (reply.choices[0].message.content or "") if reply.choices else ""
                score = parse_score(content, self.cfg.scale)
                with self._lock:
                    self.latencies.append(elapsed)
                    if score is None:
                        self.failures["unparseable"] += 1
                    else:
                        self.scored += 1
                if score is None:
                    log.debug("grader: unparseable answer %r", content[:200])
                    return None, "unparseable"
                return (score - 1) / (self.cfg.scale - 1), None
            if not retry or attempt == self.cfg.retries:
                with self._lock:
                    self.failures[reason] += 1
                return None, reason
            attempt += 1
            time.sleep(self.cfg.backoff_s * 2 ** (attempt - 1))

    def stats(self) -> dict:
        """Requests sent, samples scored, failures by reason, and latency percentiles of answered requests (s)."""
        with self._lock:
            lat = sorted(self.latencies)
            out = {"requests": self.requests, "scored": self.scored, "failures": dict(self.failures)}
        if lat:
            out["p50_s"] = lat[len(lat) // 2]
            out["p95_s"] = lat[min(len(lat) - 1, int(0.95 * len(lat)))]
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        if self._client is not None:
            self._client.close()


_GRADERS: dict[bytes, Grader] = {}
_GRADERS_LOCK = threading.Lock()
_CONFIGURED: list = []


def grader_for(cfg: GraderConfig) -> Grader:
    """The process's one grader for this config (same settings: same pool, counters and connections)."""
    import msgspec

    key = msgspec.json.encode(cfg)
    with _GRADERS_LOCK:
        if key not in _GRADERS:
            _GRADERS[key] = Grader(cfg)
        return _GRADERS[key]


def grade(cfg: GraderConfig, prompts: Sequence, completions: Sequence, **columns) -> list[float | None]:
    """Levels in [0, 1] (or None) of `completions` under the rubric of `cfg` (a `GraderConfig`)."""
    return grader_for(cfg)(prompts, completions, **columns)


def configure(cfg: GraderConfig) -> None:
    """Sets the `GraderConfig` that `rubric` uses in this process (the actor calls it with `Config.grader`)."""
    with _GRADERS_LOCK:
        _CONFIGURED[:] = [cfg]


def rubric(prompts: Sequence, completions: Sequence, **columns) -> list[float | None]:
    """TRL-signature reward: the configured grader's level of each completion in [0, 1], None where it failed."""
    if not _CONFIGURED:
        raise RuntimeError("streamrl.tasks.graders:rubric: no grader configured (the run's `grader` section is set "
                           "with streamrl.tasks.graders.configure(cfg.grader))")
    return grade(_CONFIGURED[0], prompts, completions, **columns)


def failure_counts() -> dict[str, int]:
    """Failures by reason over every grader of this process (for the run's reward-failure counters)."""
    total: Counter[str] = Counter()
    with _GRADERS_LOCK:
        graders = list(_GRADERS.values())
    for g in graders:
        with g._lock:
            total.update(g.failures)
    return dict(total)
