"""verifiers environments, unchanged: `task.name: verifiers`.

`task.verifiers_env` names a classic verifiers `Environment` (`vf.SingleTurnEnv`, `vf.MultiTurnEnv`,
`vf.ToolEnv`, ...; verifiers 0.3.x, whose `verifiers.legacy` stack answers at `import verifiers as vf`): an
installed environment id (`vf.load_environment(id, **task.verifiers_args)`), a 'path/file.py' or
'package.module' whose `load_environment` builds it, or 'package.module:fn' naming the loader itself.

Rows are the environment's own dataset (`env.get_dataset()`: its formatted `prompt`, `answer`, `info`, `task`,
`example_id`; `env.get_eval_dataset()` for evaluation rows). Each episode is one `env.run_rollout(...)` through
the actor's OpenAI-compatible endpoint, with the `openai.AsyncOpenAI` client verifiers itself uses (wrapped in
its `OpenAIChatCompletionsClient`): the environment keeps its own semantics (max_turns, the tools it declares,
its parser, its stop conditions) and its rubric scores the rollout. The episodes are run by
`streamrl.actors.agents` like any agent's (token in, token out; failures counted).

The rubric's weighted reward becomes an ordinal level by the episode runtime's one rule: with `task.reward_levels`
declared, the level within `task.reward_level_tolerance` of it (verifiers' rewards are floats: 0.74999 is 0.75; one
on no level is counted `out_of_scale`, unscored); without, `reward.bucket_edges` buckets it. A rollout verifiers
marks as errored (state["error"]: the model's empty reply, a tool's failure) keeps the reward its rubric gave it, as
in verifiers, and is counted by its error (`truncated/verifiers_<error>`); an exception out of the environment
itself is the agent's failure (counted as `raised`, unscored).

verifiers scores a rubric function that raises or returns None as 0.0 (and logs it); streamrl watches the rubric's
functions (`watch`) so one rule holds (`streamrl.tasks.reward_health.NONE_RULE`): a rollout whose rubric function
raised is unscored and counted `raised` with that function's traceback; one on which every function returned None
could not be scored (`none`); a None beside other functions' numbers is skipped (verifiers' weighted sum adds 0).

Where the installed verifiers is 0.4 (its v1 stack alone), the task loads a v1 taskset instead:
`streamrl.tasks.verifiers_v1`.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import inspect
from pathlib import Path

from streamrl.config import TaskConfig
from streamrl.tasks import plugins, verifiers_v1
from streamrl.tasks.agent import AgentTask
from streamrl.tasks.base import render
from streamrl.tasks.dataset import Row, converter
from streamrl.tasks.verifiers_loop import LoopAgent

INPUT_FIELDS = ("prompt", "answer", "info", "task", "example_id")
"""The columns of a verifiers row that make its RolloutInput."""


def load(ref: str, args: dict):
    """The environment `ref` names, built with `args`; ValueError naming what is wrong and what is allowed."""
    try:
        import verifiers as vf
    except ImportError as e:
        raise ValueError(f"task.verifiers_env={ref!r}: verifiers is not installed (pip install "
                         "'streamrl[verifiers]': verifiers 0.3.x, the classic Environment API)") from e
    if not hasattr(vf, "Environment"):
        raise ValueError(f"task.verifiers_env={ref!r}: verifiers {vf.__version__} has no classic Environment API "
                         "(0.4 ships only verifiers.v1: streamrl.tasks.verifiers_v1 loads its tasksets); install "
                         "verifiers>=0.3,<0.4 for a classic environment")
    if ":" in ref:
        loader = plugins.resolve(ref, "task.verifiers_env", "load_environment")
    elif ref.endswith(".py"):
        loader = plugins.resolve(f"{ref}:load_environment", "task.verifiers_env", "load_environment")
    else:
        loader = None
        try:
            module = importlib.import_module(ref.replace("-", "_").split("/")[-1])
            loader = getattr(module, "load_environment", None)
        except ImportError:
            pass
        if loader is None:
            raise ValueError(f"task.verifiers_env={ref!r}: no installed environment module {ref!r} with a "
                             "load_environment (install it, e.g. `vf-install`/`prime env install`), or give "
                             "'path/file.py' or 'package.module:load_environment'")
    env = loader(**args)
    if not isinstance(env, vf.Environment):
        raise ValueError(f"task.verifiers_env={ref!r}: load_environment returned a {type(env).__name__}, not a "
                         "verifiers Environment")
    if env.requires_group_rollouts:
        raise ValueError(f"task.verifiers_env={ref!r}: its rubric scores whole groups (requires_group_rollouts); "
                         "streamrl scores each rollout as it ends: group rubrics are not supported yet")
    watch(env.rubric)
    return env


SCORING: contextvars.ContextVar[list | None] = contextvars.ContextVar("streamrl_rubric_calls", default=None)
"""The rollout in flight's rubric calls, as (function name, outcome, exception or None): outcome ok, none or raised.
Set in the rollout's own task, so the calls verifiers makes for it (awaited or gathered) land in its list."""


def watch(rubric) -> None:
    """Wrap each reward function of `rubric` (and of a RubricGroup's rubrics) so a rollout sees what verifiers
    hides: it turns a function's None or exception into 0.0 with a log line. The functions are called as before
    (functools.wraps keeps the signature verifiers reads their arguments from)."""
    for inner in getattr(rubric, "rubrics", None) or []:
        watch(inner)
    funcs, weights = getattr(rubric, "funcs", None), getattr(rubric, "weights", None)
    if isinstance(funcs, list) and isinstance(weights, list) and len(weights) == len(funcs):
        # A weight-0 function is a metric (verifiers' add_metric: turns, tokens), which scores nothing.
        rubric.funcs = [_watched(f) if w and not getattr(f, "_streamrl_watched", False) else f
                        for f, w in zip(funcs, weights)]


def _watched(func):
    name = getattr(func, "__name__", repr(func))

    def note(outcome: str, err: BaseException | None = None) -> None:
        if (calls := SCORING.get()) is not None:
            calls.append((name, outcome, err))

    @functools.wraps(func)
    def call(*args, **kwargs):
        try:
            got = func(*args, **kwargs)
        except Exception as e:
            note("raised", e)
            raise
        if not inspect.isawaitable(got):
            note("none" if got is None else "ok")
            return got

        async def awaited():
            try:
                value = await got
            except Exception as e:
                note("raised", e)
                raise
            note("none" if value is None else "ok")
            return value
        return awaited()

    call._streamrl_watched = True
    return call


def rows(dataset, where: str) -> list[Row]:
    """A verifiers dataset's rows as the task's rows: its formatted prompt, the rest as columns."""
    convert, out = converter("prompt"), []
    for i, r in enumerate(dataset):
        r = dict(r)
        if isinstance(r.get("prompt"), list):  # verifiers keeps None fields (tool_calls, ...) on its messages
            r["prompt"] = [{"role": m["role"], "content": m["content"]} for m in r["prompt"]]
        try:
            out.append(convert(r))
        except ValueError as e:
            raise ValueError(f"task.verifiers_env: {where} row {i}: {e}") from e
    if not out:
        raise ValueError(f"task.verifiers_env: the environment's {where} dataset is empty")
    return out


class VerifiersTask(AgentTask):
    """The environment's dataset; each sample is one rollout of the environment, scored by its rubric."""

    def __init__(self, cfg: TaskConfig):
        name = f"verifiers:{Path(cfg.verifiers_env).name}"
        if verifiers_v1.installed():  # verifiers 0.4: the v1 stack (streamrl.tasks.verifiers_v1)
            self.env = verifiers_v1.load(cfg.verifiers_env, dict(cfg.verifiers_args))
            train, tasks = verifiers_v1.rows(self.env, repr(cfg.verifiers_env))
            self._keep(cfg, train, None)
            self.agent_fn = verifiers_v1.Episodes(self.env, tasks, name)
        else:
            self.env = load(cfg.verifiers_env, dict(cfg.verifiers_args))
            has_eval = getattr(self.env, "eval_dataset", None) is not None
            self._keep(cfg, rows(self.env.get_dataset(), "train"),
                       rows(self.env.get_eval_dataset(), "eval") if has_eval else None)
            self.agent_fn = Rollouts(self.env, name)
        self.functions = None

    @property
    def vocabulary(self) -> list[str]:
        """Words of the prompts and answers (the tiny word-level model's vocabulary; example ids are no words)."""
        words = list(self.extra_words)
        for r in self.train + (self.eval_rows or []):
            text = r.prompt if isinstance(r.prompt, str) else render(r.prompt)
            words += text.split() + str(r.columns.get("answer") or "").split()
        return list(dict.fromkeys(words))

    def close(self) -> None:
        self.agent_fn.close()


async def _scored(rollout):
    """The rollout's result and its rubric's calls (SCORING), collected in the rollout's own task."""
    calls: list = []
    SCORING.set(calls)
    return await rollout, calls


class Rollouts(LoopAgent):
    """The task's agent: fn(client, row) runs one `env.run_rollout` on the agent's event loop, shared by every
    episode with one `openai.AsyncOpenAI` (a client costs milliseconds to make: its TLS context), each call
    sending its episode's credential (the api_key of the client it was handed) and id."""

    def __init__(self, env, name: str):
        super().__init__(name)
        self.env = env
        self._oai = None

    def __call__(self, client, row: dict) -> float:
        import openai
        from verifiers.clients import OpenAIChatCompletionsClient

        def setup(loop):
            self._oai = openai.AsyncOpenAI(base_url=str(client.base_url), api_key="streamrl", max_retries=0,
                                           timeout=client.timeout)

        self._start(setup)
        episode = client.default_headers["X-Episode-Id"]
        given = {k: row[k] for k in INPUT_FIELDS if k in row}
        oai = OpenAIChatCompletionsClient(self._oai.with_options(api_key=client.api_key,
                                                                 default_headers={"X-Episode-Id": episode}))
        out, calls = self._run(_scored(self.env.run_rollout(given, oai, "policy", {})))
        if err := out.get("error"):
            self._count_error(f"verifiers_{err.get('error', 'error') if isinstance(err, dict) else type(err).__name__}")
        if raised := next((e for _, outcome, e in calls if outcome == "raised"), None):
            raise raised  # verifiers scored it 0.0: a failed sample is unscored, counted `raised` with its traceback
        if calls and all(outcome == "none" for _, outcome, _ in calls):
            return None  # no function could score it (verifiers made it 0.0): unscored, counted `none`
        reward = out.get("reward")
        if not isinstance(reward, (int, float)) or isinstance(reward, bool):
            return reward  # the agent runner counts a reward that is no number
        return float(reward)
