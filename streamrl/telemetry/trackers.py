"""Experiment trackers (`monitoring.report_to`): TensorBoard, Weights & Biases, MLflow and trackio, fed the
learner's step records, the same dicts it writes to metrics.jsonl, and the run's summary at the end.

Each tracker is a writer in `TRACKERS`: `open(run)` starts it (the run's config goes in as its
hyper-parameters), `log(metrics, step)` takes one step's scalars, `close(summary)` ends it. Its library is
imported only inside `open`, so a run that names no tracker never imports one. `problems` says before the run
starts which named trackers lack their library (with the extra that installs it), `start_warnings` which will
likely not start; `Trackers` is what the learner holds: it opens the named writers and calls them from a
thread of its own, so a slow tracker never holds up a step, and a writer that raises never stops the learner:
the failure is logged once per tracker, counted and reported in summary.json (`trackers`).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import netrc
import os
import queue
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from streamrl import registry
from streamrl.registry import Registry

log = logging.getLogger("streamrl.trackers")


@dataclass(frozen=True)
class RunInfo:
    """What a tracker needs of the run: its name, its directory, the project it is filed under and its config."""

    name: str
    path: Path
    project: str
    config: dict[str, Any] = field(default_factory=dict)  # the run's config as plain data (config.to_dict)


class Writer(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self, summary: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Tracker:
    """A registered tracker: the module it needs, the pip extra that installs it, and how to open a writer."""

    module: str
    extra: str
    open: Callable[[RunInfo], Writer]

    def install_hint(self) -> str:
        return f"pip install 'streamrl[{self.extra}]'"


TRACKERS: Registry = registry.TRACKERS  # one registry for every kind of plug-in (streamrl.registry)


def problems(names: list[str]) -> list[str]:
    """One line for each named tracker whose library is not installed (looked up, not imported: fast)."""
    out = []
    for name in names:
        t = TRACKERS.get(name)
        if importlib.util.find_spec(t.module) is None:
            out.append(f"monitoring.report_to: tracker {name!r} needs the {t.module!r} package, which is not "
                       f"installed; {t.install_hint()} (or drop {name} from report_to)")
    return out


def start_warnings(names: list[str]) -> list[str]:
    """Lines for trackers that will likely fail to start. W&B online needs an API key: where none is in the
    places looked at cheaply (WANDB_API_KEY, WANDB_IDENTITY_TOKEN_FILE, ~/.netrc), wandb.init will refuse."""
    if not any(TRACKERS.can(n, "api_key_needed") for n in names) or os.environ.get("WANDB_MODE", "online") in ("offline", "disabled", "dryrun"):
        return []
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return []
    host = urllib.parse.urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        if netrc.netrc(os.environ.get("NETRC")).authenticators(host):
            return []
    except (OSError, netrc.NetrcParseError):
        pass
    return [f"monitoring.report_to: wandb finds no API key for {host} (WANDB_API_KEY, ~/.netrc); unless `wandb "
            "login` stored one elsewhere it will not start and the run goes on without it; WANDB_MODE=offline "
            "writes offline runs to sync later"]


def scalars(record: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of a step record, nested dicts flattened with '/' (lag_hist → lag_hist/0); strings, lists and
    nulls dropped, booleans as 0/1. `step` is the x axis, not a metric."""
    out: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(scalars(value, f"{name}/"))
        elif isinstance(value, (bool, int, float)) and name != "step":
            out[name] = float(value)
    return out


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'model': {'path': None}} → {'model.path': None}: the config as the flat parameters MLflow and
    TensorBoard's hparams take."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


MAX_PENDING = 1000  # step records waiting for a slow tracker; past this, new ones are dropped for it (and counted)
WAIT_S = 120.0  # how long the end of a run waits for the trackers to take what is pending and close


class Trackers:
    """The writers a run reports to, called from one thread of their own: a slow or hung tracker (a server that
    stopped answering, MLflow's retries) never holds up a learner step. Opening one that fails leaves it out
    (logged); a call that raises is logged the first time for each tracker, counted every time, and the others
    go on. The end of the run waits at most `wait_s` for them."""

    def __init__(self, names: list[str], run: RunInfo, max_pending: int = MAX_PENDING, wait_s: float = WAIT_S):
        self.names = list(names)
        self.failures: dict[str, int] = {name: 0 for name in self.names}
        self.dropped = 0  # step records no tracker got: the queue was full
        self.open_s = 0.0  # starting the writers (their imports included), before the first step
        self.log_s = 0.0  # time in the writers' log calls, on the trackers' thread
        self.wait_s = wait_s
        self._told: set[str] = set()
        self._writers: dict[str, Writer] = {}
        self._last_step = 0
        self._closed = False
        self._stuck = False
        self._abandoned = False
        for name in self.names:
            t0 = time.perf_counter()
            try:
                self._writers[name] = TRACKERS.get(name).open(run)
                log.info("reporting to %s", name)
            except Exception as e:
                self._fail(name, "could not start", e)
            self.open_s += time.perf_counter() - t0
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._thread = threading.Thread(target=self._work, name="streamrl-trackers", daemon=True)
        if self._writers:
            self._thread.start()

    def log(self, record: dict[str, Any]) -> None:
        """Hand one step record (a metrics.jsonl line's dict) to every writer; returns at once."""
        if not self._writers or self._closed:
            return
        try:
            self._queue.put_nowait(("log", int(record["step"]), scalars(record)))
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                log.error("trackers: %d step records are waiting for the trackers (%s); step %s and further ones "
                          "are dropped for them until they catch up (counted in summary.json)",
                          self._queue.maxsize, ", ".join(self._writers), record["step"])

    def samples(self, step: int, table: tuple[list[str], list[list]]) -> None:
        """Hand one logged step's samples, (columns, rows), to every writer that keeps tables; returns at once."""
        if self._writers and not self._closed:
            try:
                self._queue.put_nowait(("samples", step, table))
            except queue.Full:
                self.dropped += 1

    def report(self) -> dict[str, Any]:
        """What summary.json says of the trackers, once they have taken what is pending (at most wait_s)."""
        if not self.names:
            return {}
        self._drain()
        return {"trackers": {"report_to": self.names, "failures": dict(self.failures), "dropped": self.dropped,
                             "open_s": round(self.open_s, 6), "log_s": round(self.log_s, 6)}}

    def close(self, summary: dict[str, Any] | None) -> None:
        """End every writer once, with the run's summary (None: the summary could not be made; closed as failed)."""
        if self._closed:
            return
        self._closed = True
        if not self._thread.is_alive():
            return
        summary = summary if summary is not None else {"status": "failed"}
        try:
            self._queue.put(("close", 0, summary), timeout=0 if self._stuck else self.wait_s)
            self._thread.join(0 if self._stuck else self.wait_s)
        except queue.Full:
            pass
        if self._thread.is_alive():
            self._abandoned = True  # should the writer ever come back, its thread ends instead of going on
            log.error("trackers: %s did not finish within %g s; the learner ends without them (their runs may "
                      "show as still running)", ", ".join(self._writers), self.wait_s)

    def _drain(self) -> None:
        if self._stuck or not self._thread.is_alive():
            return
        with self._queue.all_tasks_done:
            self._stuck = not self._queue.all_tasks_done.wait_for(lambda: not self._queue.unfinished_tasks,
                                                                   self.wait_s)

    def _work(self) -> None:
        while True:
            what, step, payload = self._queue.get()
            try:
                if self._abandoned:
                    return
                if what == "close":
                    self._each("close", payload)
                    return
                self._last_step = step
                t0 = time.perf_counter()
                self._each(what, payload, step)
                self.log_s += time.perf_counter() - t0
            finally:
                self._queue.task_done()

    def _each(self, method: str, *args) -> None:
        for name, writer in self._writers.items():
            if not hasattr(writer, method):  # `samples`: a writer that keeps no tables
                continue
            try:
                getattr(writer, method)(*args)
            except Exception as e:
                self._fail(name, f"{method} failed at step {self._last_step}", e)

    def _fail(self, name: str, what: str, e: Exception) -> None:
        self.failures[name] += 1
        if name in self._told:
            return
        self._told.add(name)
        hint = f"; {TRACKERS.get(name).install_hint()}" if isinstance(e, ImportError) else ""
        log.error("tracker %s: %s: %s: %s%s (the run goes on; further failures of %s are counted in "
                  "summary.json, not logged)", name, what, type(e).__name__, e, hint, name)


def _summary_scalars(summary: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in scalars(summary).items() if math.isfinite(v)}


def _status(summary: dict[str, Any]) -> str:
    return str(summary.get("status", "failed"))


# --- TensorBoard: event files in RUN_DIR/tensorboard (`tensorboard --logdir runs` shows every run) ----------


class _TensorBoard:
    def __init__(self, run: RunInfo):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self.writer = SummaryWriter(log_dir=str(run.path / "tensorboard"))
        self.step = 0
        params = {k: v if isinstance(v, (bool, int, float, str)) else json.dumps(v)
                  for k, v in flat_config(run.config).items()}
        # The hparams summaries go into this run's own event file (add_hparams would open a sub-run beside it).
        for summary in hparams(params, {}):
            self.writer.file_writer.add_summary(summary)
        self.writer.add_text("config", "```\n" + json.dumps(run.config, indent=2) + "\n```")

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.step = step
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def samples(self, table: tuple, step: int) -> None:
        columns, rows = table  # a markdown table: TensorBoard's text tab renders it
        cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
        lines = ["|".join(columns), "|".join("---" for _ in columns)] + ["|".join(map(cell, r)) for r in rows]
        self.writer.add_text("samples", "\n".join(lines), step)

    def close(self, summary: dict[str, Any]) -> None:
        for key, value in _summary_scalars(summary).items():
            self.writer.add_scalar(f"summary/{key}", value, self.step)
        self.writer.add_text("summary", "```\n" + json.dumps(summary, indent=2, default=str) + "\n```", self.step)
        self.writer.close()


# --- Weights & Biases: online by default; WANDB_MODE=offline writes RUN_DIR/wandb for `wandb sync` ----------


class _WandB:
    def __init__(self, run: RunInfo):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", run.project), name=run.name,
                              config=run.config, dir=os.environ.get("WANDB_DIR") or str(run.path),
                              reinit="create_new")

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def samples(self, table: tuple, step: int) -> None:
        self.run.log({"samples": self.wandb.Table(columns=list(table[0]), data=table[1])}, step=step)

    def close(self, summary: dict[str, Any]) -> None:
        self.run.summary.update(_summary_scalars(summary) | {"status": _status(summary)})
        self.run.finish(exit_code=0 if _status(summary) != "failed" else 1)
        # finish() returns before wandb's service has written the run's last records; a forked learner ends in
        # os._exit, where wandb's own atexit wait never runs: wait here.
        self.wandb.teardown()


# --- MLflow: MLFLOW_TRACKING_URI, else a local file store at RUN_DIR's parent/mlruns -------------------------

MLFLOW_STATUS = {"finished": "FINISHED", "stopped": "KILLED", "failed": "FAILED"}
MLFLOW_PARAM_CHARS = 6000  # MLflow refuses longer parameter values
MLFLOW_BATCH = 100  # log_batch takes at most 100 parameters and 1000 metrics a call


def mlflow_key(name: str) -> str:
    """A metric name MLflow takes (letters, digits, _ - . : / and spaces): eval/pass@1 → eval/pass_at_1."""
    return re.sub(r"[^\w\-.:/ ]", "_", name.replace("@", "_at_"))


def mlflow_uri(run: RunInfo) -> str:
    """The tracking URI: MLFLOW_TRACKING_URI when set, else a file store beside the run directories (one store
    for all runs under run_dir, so MLflow's UI compares them)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"file:{(run.path.parent / 'mlruns').resolve()}"


class _MLflow:
    def __init__(self, run: RunInfo):
        uri = mlflow_uri(run)
        if uri.startswith("file:"):
            # MLflow 3 refuses its file store unless asked: a local store needs no server or database package.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self.Metric = Metric
        self.client = MlflowClient(tracking_uri=uri)
        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", run.project)
        experiment = self.client.get_experiment_by_name(experiment_name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(experiment_name)
        self.run_id = self.client.create_run(experiment_id, run_name=run.name).info.run_id
        params = [Param(k, json.dumps(v) if not isinstance(v, str) else v)
                  for k, v in flat_config(run.config).items()]
        params = [Param(p.key, p.value[:MLFLOW_PARAM_CHARS]) for p in params]
        for i in range(0, len(params), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + MLFLOW_BATCH])
        self.step = 0

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.step = step
        now = int(time.time() * 1000)
        batch = [self.Metric(mlflow_key(k), v, now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])

    def samples(self, table: tuple, step: int) -> None:  # an artifact per logged step: samples/step-<N>.json
        self.client.log_dict(self.run_id, {"columns": list(table[0]), "data": table[1]}, f"samples/step-{step}.json")

    def close(self, summary: dict[str, Any]) -> None:
        self.client.log_dict(self.run_id, summary, "summary.json")
        now = int(time.time() * 1000)
        batch = [self.Metric(mlflow_key(f"summary/{k}"), v, now, self.step)
                 for k, v in _summary_scalars(summary).items()]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])
        self.client.set_terminated(self.run_id, MLFLOW_STATUS.get(_status(summary), "FAILED"))


# --- trackio: a local SQLite database (TRACKIO_DIR, else trackio's default), `trackio show` -------------------


class _Trackio:
    def __init__(self, run: RunInfo):
        import trackio

        self.trackio = trackio
        # No system-metrics threads: the learner's host figures are Prometheus's job.
        self.run = trackio.init(project=run.project, name=run.name, config=run.config,
                                auto_log_cpu=False, auto_log_gpu=False)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self, summary: dict[str, Any]) -> None:
        self.run.finish()


TRACKERS.register("tensorboard")(Tracker(module="tensorboard", extra="tensorboard", open=_TensorBoard))
TRACKERS.register("wandb", capabilities={"api_key_needed"})(Tracker(module="wandb", extra="wandb", open=_WandB))
TRACKERS.register("mlflow")(Tracker(module="mlflow", extra="mlflow", open=_MLflow))
TRACKERS.register("trackio")(Tracker(module="trackio", extra="trackio", open=_Trackio))
