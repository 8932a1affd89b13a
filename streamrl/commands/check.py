"""`streamrl check`: validate a config, run every check a start would, and print the config resolved."""

from __future__ import annotations

import argparse
import sys

from streamrl import config as config_lib
from streamrl.commands import options, start
from streamrl.registry import TASKS


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("check", help="validate a config and print it resolved")
    options.add_config(p)


def main(args: argparse.Namespace) -> int:
    if (loaded := options.load(args, model_check=True)) is None:
        return 2
    cfg = loaded[2]
    if not start.before_start(cfg, args, "check"):
        return 2
    if (report := task_report(cfg)) is None:
        return 2
    if not rewards_work(cfg):
        return 2
    from streamrl.commands.episode_check import episodes_work

    if not episodes_work(cfg):
        return 2
    for note in special_values(cfg):
        print(f"streamrl check: note: {note}", file=sys.stderr)
    print(config_lib.dump(cfg) + report, end="")
    return 0


def special_values(cfg: config_lib.Config) -> list[str]:
    """What each set option with a special value does: port 0 is any free port for the channels and the endpoint,
    but no server at all for monitoring (the same 0, two meanings: docs/reference/config.md)."""
    notes = [f"transport.{k}=0: any free port (streamrl run tells the actors; a learner started alone logs the port "
             "it bound)" for k in ("group_port", "weights_port", "weights_request_port", "weight_sync_port")
             if getattr(cfg.transport, k) == 0]
    notes += [f"monitoring.{k}=0: no metrics server and no /healthz for the {k.split('_')[0]} (Prometheus scrapes "
              "nothing)" for k in ("learner_port", "actor_port") if getattr(cfg.monitoring, k) == 0]
    if cfg.endpoint.port == 0 and config_lib.rollout_kind(cfg.task) == "agent_episodes":
        notes.append("endpoint.port=0: each actor's agent endpoint on any free port")
    return notes


REFERENCE_COLUMNS = ("answer", "solution", "reference", "target", "ground_truth", "label")
ROWS_TRIED = 3


def rewards_work(cfg: config_lib.Config) -> bool:
    """Call each of a dataset task's reward functions on its first rows, with the row's reference answer as a
    completion where one exists (a column of REFERENCE_COLUMNS), as a run would: each failure named on stderr
    (function, row, error). False when a function fails on every row tried: a run would stop on it."""
    if not TASKS.can(cfg.task.name, "reward_functions") or not cfg.task.reward:
        return True
    from streamrl.tasks import build
    from streamrl.tasks.reward_functions import plain
    from streamrl.tasks.reward_health import NONE_RULE, error_line

    task = build(cfg.task)
    try:
        rows = task.train[:ROWS_TRIED]
        ok = True
        for fn, ref in zip(task.functions.fns, task.functions.refs):
            failed = 0
            for i, row in enumerate(rows, 1):
                reference = next((str(row.columns[c]) for c in REFERENCE_COLUMNS if c in row.columns), None)
                texts = [reference, "no"] if reference is not None else ["no", ""]
                call = task.call(task.prompt(row), texts, [[], []])
                try:
                    got = fn(**call.kwargs)
                    why = None if (values := plain(got)) is not None and len(values) == 2 else (
                        f"returned {got!r:.120}, not a list of 2 floats or None")
                except Exception as e:
                    why = error_line(f"{type(e).__name__}: {e}")
                if why is None and all(v is None for v in values):
                    why = f"returned {values}: could not score either completion ({NONE_RULE})"
                if why is not None:
                    failed += 1
                    print(f"streamrl check: warning: task.reward {ref} on row {i} of {cfg.task.data}: {why}",
                          file=sys.stderr)
                elif i == 1:
                    tried = "its reference answer" if reference is not None else "a made-up completion"
                    print(f"streamrl check: task.reward {ref} on row 1 ({tried}, then 'no'): {values}", file=sys.stderr)
            if rows and failed == len(rows):
                print(f"streamrl check: error: task.reward {ref} failed on every row tried ({failed}); a run would "
                      "stop on it", file=sys.stderr)
                ok = False
        return ok
    finally:
        task.close()


def task_report(cfg: config_lib.Config) -> str | None:
    """A task that has one gives its `sample_report` (a sample prompt, a right and a wrong answer's scores) as YAML
    comments to print after the config, so the output stays loadable YAML; "" without one; None (the error
    printed) when the task cannot be built."""
    from streamrl.tasks import TASKS, build
    from streamrl.tasks.base import optional

    if optional(TASKS.get(cfg.task.name), "sample_report") is None:
        return ""
    try:
        report = optional(build(cfg.task), "sample_report")()
    except ValueError as e:
        print(f"streamrl: config error: {e}", file=sys.stderr)
        return None
    return "".join(f"# {line}\n" for line in report.splitlines())
