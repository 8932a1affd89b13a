"""What the commands share: the CONFIG argument and its overrides, loading it, and how a tool reports a bad one.

Every command module has `add_parser(subparsers)` and `main(args) -> int`; `streamrl.commands.cli` lists them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from streamrl import config as config_lib

CONFIG_HELP = ("[CONFIG] [key=value ...]: a YAML file or a shipped recipe's name, e.g. paper/corpo.yaml (default: "
               "the tiny CPU job), and dotted overrides")
OVERWRITE_HELP = "if runs/<name>/ already holds a run, move it aside to runs/<name>.old-<time> (never deleted)"


def add_config(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs="*", help=CONFIG_HELP)


def process_name(args: argparse.Namespace) -> str:
    """The name a command logs and prints as: `learner`, `actor-<index>`, else the command."""
    return {"learner": "learner", "actor": f"actor-{getattr(args, 'index', 0)}"}.get(args.command, args.command)


def split_args(items: list[str]) -> tuple[str | None, list[str]]:
    """The first item that is not key=value (or is an existing file) is the config path."""
    path, overrides = None, []
    for item in items:
        if path is None and not overrides and ("=" not in item or Path(item).is_file()):
            path = item
        elif "=" in item:
            overrides.append(item)
        else:
            raise config_lib.ConfigError(
                f"unexpected argument {item!r}: give one CONFIG file, then key=value overrides")
    return path, overrides


def load(args: argparse.Namespace, default: bool = True,
         model_check: bool = False) -> tuple[str | None, list[str], config_lib.Config] | None:
    """(CONFIG path, overrides, the loaded config); None once a config error is printed (status 2).
    default: no CONFIG means the tiny job. model_check: a model that cannot load fails here, not 30 s in."""
    try:
        path, overrides = split_args(args.args)
        if path is None and default:
            path = str(config_lib.DEFAULT_CONFIG) if config_lib.DEFAULT_CONFIG.is_file() else None
        cfg = config_lib.load(path, overrides)
        if model_check:
            from streamrl.models.model import path_problem

            if problem := path_problem(cfg.model.path):
                raise config_lib.ConfigError(problem)
    except config_lib.ConfigError as e:
        msg = str(e)
        print(f"streamrl: {msg if msg.startswith('config error') else 'config error: ' + msg}", file=sys.stderr)
        return None
    return path, overrides, cfg


def run_dir(path: str) -> Path:
    from streamrl.run import checkpoints

    return checkpoints.run_dir_of(path)


def tool(args: argparse.Namespace, body: Callable[[], int]) -> int:
    """Run a command that reads a run or samples a policy (eval, difficulty, uplift): a bad config, path or argument
    is one line and status 2."""
    try:
        return body()
    except (config_lib.ConfigError, FileNotFoundError, ValueError) as e:
        msg = str(e)
        print(f"streamrl {args.command}: error: {msg.removeprefix('config error: ')}", file=sys.stderr)
        return 2
    except TimeoutError as e:
        print(f"streamrl {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"streamrl {args.command}: interrupted", file=sys.stderr)
        return 130


def at_least_one(args: argparse.Namespace, *flags: str) -> None:
    for flag in flags:
        if (v := getattr(args, flag)) is not None and v < 1:
            raise config_lib.ConfigError(f"--{flag} {v}: must be at least 1")
