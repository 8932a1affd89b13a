"""verifiers 0.4's v1 stack, unchanged: `task.name: verifiers` where the installed verifiers is v1-only.

`task.verifiers_env` names a v1 taskset as `vf-eval` does: an installed taskset id (`copy-v1`: the package
`copy_v1`, whose `__all__` exports its `vf.Taskset` subclass, and optionally its own `vf.Harness` and `vf.Env`), or
a path to such a package's folder. `task.verifiers_args` is the taskset's config (`--env.taskset.*`). The env is
verifiers' own (`vf.load_environment`: the taskset's `Env`, else `SingleAgentEnv`), its harness the taskset's own,
else verifiers' `bash`.

Rows are the taskset's tasks (`list(env.taskset)`). Each episode is one `env.run_episode(task, ctx)`: the harness
runs, every model call it makes goes through verifiers' interception server (its `@vf.stop`/`@vf.intercept` hooks,
its trace) to the actor's OpenAI-compatible endpoint, and the task's `@vf.reward` functions score the trace. The
episode's credential (its id and key: `streamrl.actors.credentials`) rides in each request's `user` field (a
sampling override: the interception imposes it on every call, while its api_key is one for all episodes), so the
endpoint admits the calls and joins the turns into one sample, token in, token out. Harnesses run on the local runtime
(`subprocess`): a role that pins a container or remote runtime, a task or harness that needs a container, a
multi-agent env and an infinite taskset are refused at load.

The trace's weighted reward becomes an ordinal level as for classic environments. An episode verifiers ended in
error keeps its reward when its rewards were scored (the error is counted, `truncated/verifiers_<type>`); one whose
rewards never ran (the env, the harness or the model call failed first) is the agent's failure (counted as
`raised`, scored lowest).
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

from streamrl.tasks.dataset import Row, converter
from streamrl.tasks.verifiers_loop import LoopAgent

API_KEY_VAR = "STREAMRL_VERIFIERS_API_KEY"
"""The environment variable the interception's client reads its key from: unset, verifiers sends "EMPTY" (the
episode's credential rides in `user` instead); never verifiers' default PRIME_API_KEY, whose Prime CLI config it
would read."""


def installed() -> bool:
    """Whether the installed verifiers is the v1 stack alone (0.4: no classic `Environment` at `import verifiers`)."""
    try:
        import verifiers
    except ImportError:
        return False
    return not hasattr(verifiers, "Environment") and importlib.util.find_spec("verifiers.v1") is not None


def _taskset_id(ref: str) -> str:
    """The taskset id `ref` names: a package folder is made importable and named by its folder's name."""
    path = Path(ref)
    if (path / "__init__.py").is_file():
        parent = str(path.resolve().parent)
        if parent not in sys.path:
            sys.path.insert(0, parent)
        return path.resolve().name
    if ref.endswith(".py") or ":" in ref:
        raise ValueError(f"task.verifiers_env={ref!r}: verifiers 0.4 loads v1 tasksets only, named by an installed "
                         "taskset id ('copy-v1') or a package folder ('path/copy_v1'); a classic environment "
                         "('file.py', 'module:load_environment') needs verifiers>=0.3,<0.4 (streamrl[verifiers])")
    return ref


def load(ref: str, args: dict):
    """The v1 env of the taskset `ref` names, its config `args`, every role on the local runtime; ValueError naming
    what is wrong and what is allowed."""
    import verifiers.v1 as vf
    from verifiers.v1.configs.agent import agent_config_fields

    where = f"task.verifiers_env={ref!r}"
    taskset_id = _taskset_id(ref)
    try:
        cfg = vf.resolve_env_config({"taskset": {**args, "id": taskset_id}})
    except ModuleNotFoundError as e:
        missing = getattr(e.__cause__, "name", None) or e.name  # verifiers re-raises it: the cause names the module
        raise ValueError(f"{where}: no installed v1 taskset {taskset_id!r} (no module {missing!r}); install it "
                         "(`prime env install`, pip), or give the path of its package folder") from e
    except (TypeError, AttributeError) as e:  # a module without an exported Taskset subclass
        raise ValueError(f"{where}: {e}") from e
    except ValueError as e:  # pydantic's ValidationError (a config key it lacks, a value it refuses); an export
        fit = "task.verifiers_args do not fit the taskset's config: " if type(e).__name__ == "ValidationError" else ""
        raise ValueError(f"{where}: {fit}{e}") from e
    roles = agent_config_fields(cfg)
    if len(roles) != 1:
        raise ValueError(f"{where}: its env declares {len(roles)} agents ({', '.join(roles)}); streamrl trains one "
                         "policy per episode: only single-agent envs (SingleAgentEnv, the default) are supported")
    (role, spec), = roles.items()
    declared = type(cfg).model_fields[role].default
    if "runtime" in declared.model_fields_set and spec.runtime.type != "subprocess":
        raise ValueError(f"{where}: its agent pins the {spec.runtime.type!r} runtime (containers, sandboxes): not "
                         "supported; allowed: harnesses that run on the local (subprocess) runtime")
    cfg = cfg.model_copy(update={role: spec.model_copy(update={"runtime": vf.SubprocessConfig()})})
    env = vf.load_environment(cfg)
    harness = env._harnesses[role]
    if harness.NEEDS_CONTAINER:
        raise ValueError(f"{where}: its harness {harness.config.id!r} needs a container runtime: not supported; "
                         "allowed: harnesses that run locally (the taskset's own, null, bash)")
    if type(env.taskset).task_type().NEEDS_CONTAINER:
        raise ValueError(f"{where}: its tasks need a container (NEEDS_CONTAINER): not supported")
    if not env.taskset.bounded:
        raise ValueError(f"{where}: an infinite taskset (INFINITE): not supported; streamrl samples from a list")
    return env


def rows(env, where: str) -> tuple[list[Row], list]:
    """The taskset's tasks as the task's rows (the prompt, with the task's system prompt first; the task's index in
    column "task_index", its other text fields as columns) and the tasks themselves."""
    tasks = list(env.taskset)
    if not tasks:
        raise ValueError(f"task.verifiers_env: the taskset {where} has no tasks")
    convert, out = converter("prompt"), []
    for i, task in enumerate(tasks):
        data = task.data.model_dump(mode="json", exclude_none=True)
        prompt = data.pop("prompt", None)
        if isinstance(prompt, list):
            prompt = [{"role": m["role"], "content": m.get("content") or ""} for m in prompt]
        if isinstance(prompt, str) and task.data.system_prompt:
            prompt = [{"role": "user", "content": prompt}]
        if isinstance(prompt, list) and task.data.system_prompt:
            prompt = [{"role": "system", "content": task.data.system_prompt}, *prompt]
        columns = {k: v for k, v in data.items() if isinstance(v, str) and k != "system_prompt"}
        try:
            out.append(convert({**columns, "prompt": prompt, "task_index": i}))
        except ValueError as e:
            raise ValueError(f"task.verifiers_env: {where} task {i}: {e}") from e
    return out, tasks


class Episodes(LoopAgent):
    """The task's agent: fn(client, row) runs one `env.run_episode` on the agent's event loop, inside the env's
    `serving()` (its interception server and shared tools, up once for the actor's life), and returns the trace's
    weighted reward."""

    def __init__(self, env, tasks: list, name: str):
        super().__init__(name)
        self.env, self.tasks = env, tasks
        self._serving = None

    def _enter_serving(self, loop) -> None:
        serving = self.env.serving()
        asyncio.run_coroutine_threadsafe(serving.__aenter__(), loop).result()
        self._serving = serving

    def __call__(self, client, row: dict) -> float:
        import verifiers.v1 as vf

        self._start(self._enter_serving)
        ctx = vf.ModelContext(model="policy",
                              client=vf.EvalClientConfig(base_url=str(client.base_url), api_key_var=API_KEY_VAR),
                              sampling=vf.SamplingConfig(user=client.api_key))
        episode = self._run(self.env.run_episode(self.tasks[row["task_index"]], ctx))
        errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
        scored = [r for t in episode.traces for r in t.rewards.values() if r is not None]
        if errors and not scored:
            raise RuntimeError(f"verifiers episode failed: {errors[-1].type}: {errors[-1].message[:300]}")
        if errors:
            self._count_error(f"verifiers_{errors[-1].type}")
        return float(sum(r.value for r in scored))

    def close(self) -> None:
        if self._loop is not None:
            try:
                self._run(self._serving.__aexit__(None, None, None), timeout=30)
            finally:
                super().close()
