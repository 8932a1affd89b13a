"""The `streamrl` command.

  streamrl run [CONFIG] [key=value ...]        learner + actors on this machine, with progress (exit statuses below)
  streamrl learner CONFIG [key=value ...]      one learner (also under `deepspeed` or `torchrun`)
  streamrl actor CONFIG --learner HOST [...]   one actor
  streamrl check [CONFIG] [key=value ...]      validate and print the resolved config (and every bad data row)
  streamrl tasks                               the installed tasks and where each comes from (entry points)
  streamrl plan [CONFIG] [--gpus N --gpu-mem GB]  per-GPU memory the config needs, and whether it fits
  streamrl keys DIR [--actors N]               CurveZMQ key pairs (set transport.curve_keys=DIR)
  streamrl plot RUN_DIR... [--out DIR]         the paper's figures (r_count/r_loss, rewards, census) as PNG
  streamrl reproduce [CONFIG] [key=value ...]  GRPO, static and CoRPO on the tiny model: plot and table
  streamrl bench [NAME ...] [--short]          hot-path benchmarks
  streamrl eval RUN_DIR_OR_CHECKPOINT [k=v]    pass@k and mean@k of a saved policy -> RUN_DIR/eval.json
  streamrl eval --live [CONFIG] [--watch N]    the same for a running learner's newest weights
  streamrl difficulty [CONFIG] --out FILE      keep prompts with success rate in [low, high] over N rollouts
  streamrl uplift RUN_DIR [--buckets B]        post/pre likelihood ratio of correct samples by initial rank
  streamrl export RUN_DIR OUT [--step N]       a checkpoint as a Hugging Face folder (transformers, vllm serve)
  streamrl samples RUN [--step N] [--best|--worst]  what the model wrote (the run's samples.jsonl), readably
  streamrl init DIR [--force]                  copy the shipped recipes and monitoring bundle into DIR

CONFIG is a YAML file, or the name of a shipped recipe (`tiny.yaml`, `paper/corpo.yaml`). Every command takes
--log-level (default: $STREAMRL_LOG_LEVEL, else INFO); the processes `streamrl run` starts inherit it.

Any config error, or a problem found before start (run_dir, ports, keys, a run name that already
holds results), is one line on stderr and exit status 2 (`streamrl.run.preflight`).
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib import import_module

from streamrl import config as config_lib
from streamrl.commands import options

# Each command's module: `add_parser(subparsers)` adds it (a module that serves two adds both), `main(args) -> int`
# runs it. In the order `streamrl --help` lists them; the modules keep their heavy imports inside functions,
# since every one is imported to build the parser.
COMMANDS = {
    "run": "streamrl.commands.launch",
    "learner": "streamrl.commands.process",
    "actor": "streamrl.commands.process",
    "check": "streamrl.commands.check",
    "tasks": "streamrl.commands.task_list",
    "plan": "streamrl.commands.plan",
    "keys": "streamrl.commands.keys",
    "plot": "streamrl.commands.plots",
    "reproduce": "streamrl.commands.reproduce",
    "bench": "streamrl.bench.cli",
    "eval": "streamrl.commands.eval_cli",
    "difficulty": "streamrl.commands.difficulty",
    "uplift": "streamrl.commands.uplift",
    "init": "streamrl.commands.init",
    "export": "streamrl.commands.export",
    "samples": "streamrl.commands.samples",
}

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_LEVEL_ENV = "STREAMRL_LOG_LEVEL"


def _log_level_option(p: argparse.ArgumentParser, default) -> None:
    p.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default=default, metavar="LEVEL",
                   help=f"log level ({', '.join(LOG_LEVELS)}; default: ${LOG_LEVEL_ENV}, else INFO); "
                        "the processes `streamrl run` starts inherit it")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamrl", description="Asynchronous RL with ordinal rewards and CoRPO.")
    _log_level_option(p, None)
    sub = p.add_subparsers(dest="command", required=True)
    for module in dict.fromkeys(COMMANDS.values()):
        import_module(module).add_parser(sub)
    for command in sub.choices.values():  # SUPPRESS: `streamrl --log-level debug run` stays debug
        _log_level_option(command, argparse.SUPPRESS)
    return p


def log_level(args) -> str | None:
    """The level asked for: --log-level, else $STREAMRL_LOG_LEVEL, else None (the command's own default).
    Handed on through the environment, so every process `streamrl run` starts logs at it too."""
    level = args.log_level or os.environ.get(LOG_LEVEL_ENV, "").strip().upper() or None
    if level is not None and level not in LOG_LEVELS:
        raise config_lib.ConfigError(f"{LOG_LEVEL_ENV}={os.environ[LOG_LEVEL_ENV]!r}: not a log level; "
                                     f"allowed: {', '.join(LOG_LEVELS)}")
    if level is not None:
        os.environ[LOG_LEVEL_ENV] = level
    return level


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # overrides after an option (`eval RUN --watch 2 eval.prompts=8`) belong with the others
        if not hasattr(args, "args") or any(item.startswith("-") for item in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.args += extra
    try:
        level = log_level(args)
    except config_lib.ConfigError as e:
        print(f"streamrl: error: {e}", file=sys.stderr)
        return 2
    from streamrl.run.lifecycle import setup_logging

    if level is not None or args.command in ("learner", "actor"):  # the processes log at INFO unless told
        setup_logging(options.process_name(args), level or "INFO")
    return import_module(COMMANDS[args.command]).main(args)


if __name__ == "__main__":
    sys.exit(main())
