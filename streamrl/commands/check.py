"""`streamrl check`: validate a config, run every check a start would, and print the config resolved."""

from __future__ import annotations

import argparse
import sys

from streamrl import config as config_lib
from streamrl.commands import options, start


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
    print(config_lib.dump(cfg) + report, end="")
    return 0


def task_report(cfg: config_lib.Config) -> str | None:
    """A task that has one gives its `sample_report` (a sample prompt, a right and a wrong answer's scores) as YAML
    comments to print after the config, so the output stays loadable YAML; "" without one; None (the error
    printed) when the task cannot be built."""
    from streamrl.tasks import TASKS, build

    if not hasattr(TASKS.get(cfg.task.name), "sample_report"):
        return ""
    try:
        report = build(cfg.task).sample_report()
    except ValueError as e:
        print(f"streamrl: config error: {e}", file=sys.stderr)
        return None
    return "".join(f"# {line}\n" for line in report.splitlines())
