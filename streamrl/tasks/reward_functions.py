"""Reward functions by reference, in TRL's signature, scored a group at a time in a bounded pool.

`task.reward` names functions as "package.module:function" or "path/to/file.py:function"; each is called as
TRL's GRPOTrainer calls a reward function, so a TRL reward works unchanged:

    f(prompts=[...], completions=[...], completion_ids=[[...], ...], **columns) -> list[float | None]

one call per group of G samples: `prompts` repeats the group's prompt G times (a string, or for chat data the
list of messages), `completions` holds the G texts (for chat data each is `[{"role": "assistant", "content":
text}]`), and every other column of the data row comes as a list of G equal values. Several functions add
up with `task.reward_weights` (TRL's rule: a function's None is skipped; a sample no function scores is
unscored).

What can go wrong with a call, and what a run does (`Outcome.failures` counts it by reason, in samples):
- `raised` / `timeout` (longer than `task.reward_timeout_s`): the group's call is repeated one sample at a
  time, so one bad sample does not cost its group; a sample whose own call fails again is counted here.
- `bad_return`: not a list of G numbers or None; `non_finite`: NaN or ±inf; `out_of_scale`: not one of
  `task.reward_levels` (when declared); `none`: no function could score the sample (judged by the functions'
  window as any failure is: `reward_health.NONE_RULE`).
A failed sample is unscored (None); the rollout gives it its group's mean reward (so it pushes no other
sample's advantage under a mean baseline) and drops a group with no scored sample. Each (function, reason)
is logged once with its traceback; the counts reach Prometheus, the actor's report and summary.json.

Calls run on threads (`task.reward_workers`): Python cannot stop a thread, so a call past its timeout is
abandoned (counted) and keeps its thread until it returns, while the pool gets one more thread meanwhile, so
scoring goes on at full width; more than ABANDONED_PER_WORKER × workers calls hanging at once stops the run.
A function failing on most of its recent samples stops the run too, naming it (`streamrl.tasks.reward_health`).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import math
import numbers
import threading
import time
from collections import Counter
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from streamrl.tasks import plugins
from streamrl.tasks.reward_health import NONE_RULE, FailureWindow, UserCodeFailure
from streamrl.tasks.rewards import nearest_level
from streamrl.tasks.user_frames import user_traceback

log = logging.getLogger("streamrl.tasks")
REASONS = ("raised", "timeout", "bad_return", "non_finite", "out_of_scale", "none")
FAILED = object()  # a function's value for a sample whose own call failed


@runtime_checkable
class RewardFunction(Protocol):
    """A reward function as `task.reward` names it: TRL's signature (see the module docstring). It has no
    optional members; a column it does not use goes to `**columns` (or is named, as TRL's are)."""

    def __call__(self, prompts: list, completions: list, **columns: Any) -> list[float | None]:
        """One float (or None: could not score) per completion, in order; `completion_ids` comes among the
        columns, with every other column of the row as a list of G equal values."""


def resolve(ref: str) -> Callable:
    """The function `ref` names: "package.module:function" or "path/to/file.py:function" (relative to the
    working directory). Raises ValueError saying what is wrong and what is allowed."""
    return plugins.resolve(ref, "task.reward", "function")


ABANDONED_PER_WORKER = 8  # more calls than this × task.reward_workers hanging at once: the actor cannot go on


class _Running:
    """One call on a pool: when it started (empty until it does), its future, the pool it waits in."""

    def __init__(self, fn: Callable, call: Call, pool: cf.ThreadPoolExecutor):
        self.fn, self.call, self.pool = fn, call, pool
        self.started: list[float] = []
        self.future: cf.Future | None = None

    def timed(self):
        self.started.append(time.monotonic())
        return self.fn(**self.call.kwargs)


def plain(got: Any) -> list[float | None] | None:
    """A reward function's return as a list of floats and None; None when it is not one of TRL's shapes."""
    if hasattr(got, "tolist") and getattr(got, "ndim", 1) == 1:  # a numpy array or a torch tensor
        got = got.tolist()
    if not isinstance(got, (list, tuple)):
        return None
    out: list[float | None] = []
    for v in got:
        if hasattr(v, "item") and getattr(v, "ndim", None) == 0:  # a numpy scalar or a 0-d tensor
            v = v.item()
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real)):
            return None
        out.append(None if v is None else float(v))
    return out


class Call:
    """One group's (or one sample's) arguments, in TRL's shapes."""

    def __init__(self, prompt: Any, completions: Sequence[Any], completion_ids: Sequence[Sequence[int]],
                 columns: dict[str, Any]):
        n = len(completions)
        self.n = n
        self.kwargs = {"prompts": [prompt] * n, "completions": list(completions),
                       "completion_ids": [list(c) for c in completion_ids],
                       **{k: [v] * n for k, v in columns.items()}}

    def one(self, i: int) -> "Call":
        out = Call.__new__(Call)
        out.n, out.kwargs = 1, {k: [v[i]] for k, v in self.kwargs.items()}
        return out


class Outcome:
    """Per-sample scores (None: unscored) and the failures by reason; parts: per sample, each function's own value
    (None where it failed or said not applicable), for the samples log."""

    def __init__(self, scores: list[float | None], failures: Counter, parts: list[list] | None = None):
        self.scores, self.failures, self.parts = scores, failures, parts


class RewardFunctions:
    """The configured functions with their weights, scale check, timeout and worker pool."""

    def __init__(self, refs: Sequence[str], weights: Sequence[float] | None = None,
                 levels: Sequence[float] | None = None, timeout_s: float = 30.0, workers: int = 4,
                 fail_window: int = 50, fail_threshold: float = 0.5, level_tolerance: float = 1e-9):
        self.refs = list(refs)
        self.fns = [resolve(r) for r in self.refs]
        self.weights = list(weights) if weights else [1.0] * len(self.fns)
        if len(self.weights) != len(self.fns):
            raise ValueError(f"task.reward_weights={self.weights}: needs one weight per task.reward ({len(self.fns)})")
        self.levels = sorted(levels) if levels else None
        self.level_tolerance = level_tolerance
        self.timeout_s = timeout_s
        self.pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reward")
        self.workers, self.hanging = workers, 0  # hanging: abandoned calls still running (each holds a thread)
        self._logged: set[tuple[str, str]] = set()
        # A function failing on most of its recent samples stops the run (reward_health); these are every count.
        self.health = FailureWindow(fail_window, fail_threshold)
        # The sum's own window (off the scale, not finite): apart from each function's, whose samples it repeats.
        self.scale_name = f"{','.join(self.refs)} (their sum against task.reward_levels)"
        # A sample no function scored is theirs together: one function's own name, several's joined.
        self.none_name = self.refs[0] if len(self.refs) == 1 else f"{','.join(self.refs)} (together)"
        self.totals: Counter = Counter()
        self._lock = threading.Lock()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _note(self, ref: str, reason: str, detail: str) -> None:
        """Log a (function, reason) once, with its traceback or detail; later ones are only counted."""
        self.health.note(ref, reason, detail)
        with self._lock:
            if (ref, reason) in self._logged:
                return
            self._logged.add((ref, reason))
        log.warning("reward %s: %s (logged once; every occurrence is counted in reward_failures/%s)\n%s",
                    ref, reason, reason, detail.rstrip())

    def _run(self, fn: Callable, call: Call) -> "_Running":
        """fn(**call.kwargs) on the pool; the timeout runs from the call's start."""
        running = _Running(fn, call, self.pool)
        running.future = self.pool.submit(running.timed)
        return running

    def _wait(self, running: "_Running", ref: str):
        """(values, None) or (None, reason)."""
        while True:
            if running.started:
                left = running.started[0] + self.timeout_s - time.monotonic()
                try:
                    return running.future.result(timeout=max(0.0, left)), None
                except cf.TimeoutError:
                    self._note(ref, "timeout", f"a call took longer than task.reward_timeout_s={self.timeout_s}")
                    self._abandon(running.future, ref)
                    return None, "timeout"
                except Exception as e:
                    self._note(ref, "raised", user_traceback(e))
                    return None, "raised"
            if running.pool is not self.pool and running.future.cancel():  # queued behind hung calls: move it
                running.pool = self.pool
                running.future = self.pool.submit(running.timed)
            try:  # not started yet: queued behind other calls, whose time does not count against it
                return running.future.result(timeout=0.01), None
            except cf.TimeoutError:
                continue
            except Exception as e:
                self._note(ref, "raised", user_traceback(e))
                return None, "raised"

    def _abandon(self, future: cf.Future, ref: str) -> None:
        """A call past its timeout keeps its thread until it returns (Python cannot stop a thread): the pool is
        replaced by a fresh one, which takes the calls still queued, so scoring goes on at full width; the old one
        keeps only its hung threads. Raises UserCodeFailure once more calls hang than ABANDONED_PER_WORKER ×
        workers: the actor could not make progress for long (and its threads would grow without bound)."""
        with self._lock:
            self.hanging += 1
            hanging, old = self.hanging, self.pool
            self.pool = cf.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="reward")
        old.shutdown(wait=False)  # its idle threads go; calls it runs finish, its queued ones move (_wait)
        future.add_done_callback(self._returned)
        if hanging > ABANDONED_PER_WORKER * self.workers:
            raise UserCodeFailure(ref, "timeout", hanging, hanging, f"{hanging} calls still running after "
                                  f"task.reward_timeout_s={self.timeout_s} (abandoned; a reward that never returns)",
                                  self.health.first.get(ref, ("", ""))[1], dict(self.totals))

    def _returned(self, future: cf.Future) -> None:
        with self._lock:
            self.hanging -= 1

    def _values(self, ref: str, got: Any, n: int) -> tuple[list[float | None] | None, str | None]:
        """The shapes TRL takes: a list (or tuple) of Python or numpy numbers, a numpy array, a torch tensor (1-D),
        None for "not applicable"."""
        values = plain(got)
        if values is None or len(values) != n:
            self._note(ref, "bad_return", f"expected a list of {n} floats or None (a list of Python or numpy "
                                          f"numbers, a numpy array, a tensor), got {got!r:.200}")
            return None, "bad_return"
        return values, None

    def score(self, calls: Sequence[Call]) -> list[Outcome]:
        """Every group's scores, the groups' calls running side by side on the pool."""
        return self.collect(self.submit(calls))

    def submit(self, calls: Sequence[Call]) -> list:
        """Start every group's calls on the pool (they overlap on the workers, and with whatever the caller does
        next); `collect` waits for them."""
        return [(call, [self._run(fn, call) for fn in self.fns]) for call in calls]

    def collect(self, handle: list) -> list[Outcome]:
        return [self._finish(call, running) for call, running in handle]

    def _finish(self, call: Call, running) -> Outcome:
        failures: Counter = Counter()
        per_fn: list[list] = []
        fates: list[tuple[str, str | None, int]] = []  # (name, reason or None, samples) for the failure window
        judged: set[int] = set()  # samples a grader's window already counts as failed
        for fn, ref, one in zip(self.fns, self.refs, running):
            got, reason = self._wait(one, ref)
            values, reason = self._values(ref, got, call.n) if reason is None else (None, reason)
            if values is None:
                failures["calls_failed"] += 1  # every failed call, the group's and each retry's
                values = self._one_at_a_time(fn, ref, call, reason, failures, fates)
            elif (failed := getattr(got, "failed", None)) is not None:  # a grader: its None may be a failure
                self._graded(ref, got, failed, fates)
                judged.update(i for i, why in enumerate(failed) if why is not None)
            elif scored := sum(v is not None for v in values):  # its Nones: judged per sample, below
                fates.append((ref, None, scored))
            per_fn.append(values)
        scores: list[float | None] = []
        for i in range(call.n):
            column = [v[i] for v in per_fn]
            # A function that failed on this sample leaves it unscored, whatever the others say.
            if any(v is FAILED for v in column):
                scores.append(None)
                continue
            score, why = self._combine(column, failures)
            scores.append(score)
            if why == "none" and i in judged:
                continue
            if why == "none":  # nobody could score it: the functions' failure, judged by their own window
                self._note(self.none_name, "none", f"returned {per_fn[0] if len(self.fns) == 1 else column!r:.200} "
                           f"for a group of {call.n}: None for every function on a sample ({NONE_RULE})")
                fates.append((self.none_name, "none", 1))
            else:
                fates.append((self.scale_name, why, 1))
        self.totals.update(failures)
        for name, why, n in fates:
            self.health.record(name, why, self.totals, n)
        parts = [[None if v[i] is FAILED else v[i] for v in per_fn] for i in range(call.n)]
        return Outcome(scores, failures, parts)

    def _graded(self, ref: str, got, failed: list, fates: list) -> None:
        """A grader's samples into its window: those it could not grade (its server down past its retries, an
        answer off the scale) are failures, though they count as `none` like any None (graders.Graded)."""
        self.health.kinds[ref] = "grader"
        for why in failed:
            if why is not None:
                self._note(ref, f"grader_{why}", f"the grader {getattr(got, 'where', '')}: {why} "
                                                 "(streamrl.tasks.graders; grader.retries, grader.timeout_s)")
            fates.append((ref, None if why is None else f"grader_{why}", 1))

    def _one_at_a_time(self, fn: Callable, ref: str, call: Call, reason: str, failures: Counter,
                       fates: list) -> list:
        """After a group's call failed: each sample's own call (side by side), so a bad sample costs itself only.
        Each sample's fate goes to `fates`."""
        if call.n == 1:
            failures[reason] += 1
            fates.append((ref, reason, 1))
            return [FAILED]
        values: list = []
        for single in [self._run(fn, call.one(i)) for i in range(call.n)]:
            got, why = self._wait(single, ref)
            one, why = self._values(ref, got, 1) if why is None else (None, why)
            if one is None or one[0] is not None:  # a None: judged with the sample's other functions, as above
                fates.append((ref, why if one is None else None, 1))
            if one is None:
                failures[why] += 1
                failures["calls_failed"] += 1
                values.append(FAILED)
            else:
                values.append(one[0])
        return values

    def _combine(self, column: list[float | None], failures: Counter) -> tuple[float | None, str | None]:
        """(the weighted sum on the scale, None) or (None, the reason it is not one)."""
        if all(v is None for v in column):
            failures["none"] += 1
            return None, "none"
        total = sum(w * v for w, v in zip(self.weights, column) if v is not None)
        if not math.isfinite(total):
            failures["non_finite"] += 1
            self._note(self.scale_name, "non_finite", f"a reward of {total}")
            return None, "non_finite"
        if self.levels is not None:
            level = nearest_level(total, self.levels, self.level_tolerance)
            if level is None:
                failures["out_of_scale"] += 1
                self._note(self.scale_name, "out_of_scale",
                           f"a reward of {total!r}; task.reward_levels={self.levels}")
                return None, "out_of_scale"
            total = level
        return total, None
