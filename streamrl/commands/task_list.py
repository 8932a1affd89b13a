"""`streamrl tasks`: each installed task's name and origin (entry point and distribution)."""

from __future__ import annotations

import argparse
import sys


def add_parser(subparsers) -> None:
    subparsers.add_parser("tasks", help="list the installed tasks (entry-point group streamrl.tasks) and their origin")


def main(args: argparse.Namespace) -> int:
    from streamrl.tasks import TASKS

    try:
        names = TASKS.names()
    except ValueError as e:  # two packages claim one name
        print(f"streamrl tasks: error: {e}", file=sys.stderr)
        return 2
    width = max(map(len, names))
    for name in names:
        print(f"{name:<{width}}  {TASKS.origin(name)}")
    return 0
