"""Whether a user's function (a reward function, grader, environment or tool) is broken rather than flaky: a
sliding window of its recent samples (an environment's: episodes; a tool's: calls).

A function that raises, returns the wrong shape or rewards off the declared scale on a few samples costs those
samples (counted, the run goes on). One that fails on most of them is a bug in the user's code or config (a
column name, a list one item short, levels written 0.33 for 1/3): training on what is left would be training on
nothing, so the actor raises `UserCodeFailure`, which names the function, the reason, the error and its first
traceback; the actor sends it to the learner (`streamrl.comm.wire.ActorFailure`), which stops the run with it.
"""

from __future__ import annotations

import collections
import sys


class UserCodeFailure(RuntimeError):
    """A user's function failed on more than `task.reward_fail_threshold` of its last `task.reward_fail_window`
    samples. `counts`: every failure of this actor so far, by reason (samples; `calls_failed`: calls). `kind`: what
    the function is, as the terminal names it (KINDS)."""

    def __init__(self, function: str, reason: str, failed: int, window: int, error: str, traceback: str,
                 counts: dict[str, int], kind: str = "reward function"):
        self.function, self.reason, self.failed, self.window = function, reason, failed, window
        self.error, self.traceback, self.counts, self.kind, self.unit = error, traceback, counts, kind, unit(kind)
        super().__init__(f"{kind} {function} failed on {failed} of its last {window} {self.unit} "
                         f"({reason}): {error}")


NONE_RULE = "None is \"could not score\": docs/guides/faults-and-security.md#could-not-score"
"""The one rule for a None reward, wherever it comes from (reward function, environment, rubric, agent): where
several functions score a sample, one's None is skipped (TRL's rule); a sample nobody scored is unscored, counted
`none`, and judged by the failure window like any failure, so mostly-None stops the run."""


KINDS = ("reward function", "grader", "environment", "tool", "agent", "verifiers environment", "data")
"""What a failing function may be: each is judged by the same window, and stops the run the same way."""


def unit(kind: str) -> str:
    """What a window of `kind` counts: a tool's calls, an environment's episodes, anything else's samples."""
    return {"tool": "calls", "environment": "episodes", "data": "episodes"}.get(kind, "samples")


def error_line(detail: str) -> str:
    """The line of a traceback (or a plain detail) that says what went wrong: its last non-empty line."""
    lines = [line for line in detail.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no detail)"


class FailureWindow:
    """Per function name, the fate of its last `window` samples (ok or a failure reason) and its first failure's
    detail. `record` raises UserCodeFailure once the window is full and more than `threshold` of it failed."""

    def __init__(self, window: int, threshold: float, kind: str = "reward function"):
        if window < 1 or not 0.0 <= threshold <= 1.0:
            raise ValueError(f"{kind} failure window={window} (needs >= 1), threshold={threshold} (needs 0..1)")
        self.window, self.threshold, self.kind = window, threshold, kind
        self.kinds: dict[str, str] = {}
        """name → its kind where it is not `kind` (a grader among reward functions)."""
        self._fates: dict[str, collections.deque] = {}
        self._failed: collections.Counter = collections.Counter()
        self.first: dict[str, tuple[str, str]] = {}
        """name → (reason, detail) of its first failure: the traceback the user needs."""

    def note(self, name: str, reason: str, detail: str) -> None:
        """Keep the first failure's detail of `name` (a traceback, or what was wrong with the value)."""
        self.first.setdefault(name, (reason, detail))

    def record(self, name: str, reason: str | None, counts: dict[str, int], n: int = 1) -> None:
        """n samples of `name` ended with `reason` (None: scored, or not applicable). counts: the actor's totals,
        carried by the error."""
        fates = self._fates.setdefault(name, collections.deque(maxlen=self.window))
        for _ in range(min(n, self.window)):
            if len(fates) == self.window and fates[0] is not None:
                self._failed[name] -= 1
            fates.append(reason)
            self._failed[name] += reason is not None
        if len(fates) == self.window and self._failed[name] > self.threshold * self.window:
            why = collections.Counter(r for r in fates if r is not None).most_common(1)[0][0]
            first_reason, detail = self.first.get(name, (why, "(no detail kept)"))
            raise UserCodeFailure(name, why, self._failed[name], self.window, error_line(detail), detail.rstrip(),
                                  dict(counts), self.kinds.get(name, self.kind))


def timed_out(err: BaseException | None) -> bool:
    """Whether an exception out of a user's function is a timeout (a `timeout` failure, not `raised`): Python's
    own, or its openai or httpx client's (a model call that timed out), or an error one of them caused."""
    kinds = tuple([TimeoutError] + [getattr(sys.modules[m], n) for m, n in (
        ("openai", "APITimeoutError"), ("httpx", "TimeoutException")) if m in sys.modules])  # raised only if imported
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, kinds):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False
