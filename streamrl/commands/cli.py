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
  streamrl init DIR [--force]                  copy the shipped recipes and monitoring bundle into DIR

CONFIG is a YAML file, or the name of a shipped recipe (`tiny.yaml`, `paper/corpo.yaml`). Every command takes
--log-level (default: $STREAMRL_LOG_LEVEL, else INFO); the processes `streamrl run` starts inherit it.

Any config error, or a problem found before start (run_dir, ports, keys, a run name that already
holds results), is one line on stderr and exit status 2 (`streamrl.run.preflight`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from streamrl import config as config_lib
from streamrl.run import preflight


def bench_names() -> list[str]:
    """The benchmarks `streamrl bench` runs, as its registry lists them (the module imports nothing heavy)."""
    from streamrl.bench import cli as bench

    return bench.names()


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
    spec = ("[CONFIG] [key=value ...]: a YAML file or a shipped recipe's name, e.g. paper/corpo.yaml (default: "
            "the tiny CPU job), and dotted overrides")
    from streamrl.commands.launch import EXIT_STATUSES

    run = sub.add_parser("run", help="run the learner and the configured actors on this machine",
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog="exit status:\n" + "\n".join(f"  {code:>3}  {what}" for code, what in EXIT_STATUSES))
    run.add_argument("args", nargs="*", help=spec)
    overwrite = "if runs/<name>/ already holds a run, move it aside to runs/<name>.old-<time> (never deleted)"
    run.add_argument("--overwrite", action="store_true", help=overwrite)
    learner = sub.add_parser("learner", help="run one learner process")
    learner.add_argument("args", nargs="*", help=spec)
    learner.add_argument("--local_rank", "--local-rank", type=int, default=None, help="set by the deepspeed launcher")
    learner.add_argument("--overwrite", action="store_true", help=overwrite)
    actor = sub.add_parser("actor", help="run one actor process")
    actor.add_argument("args", nargs="*", help=spec)
    actor.add_argument("--learner", default=None, help="learner host (default: transport.host)")
    actor.add_argument("--index", type=int, default=0, help="actor index: its id and seed")
    check = sub.add_parser("check", help="validate a config and print it resolved")
    check.add_argument("args", nargs="*", help=spec)
    sub.add_parser("tasks", help="list the installed tasks (entry-point group streamrl.tasks) and their origin")
    plan = sub.add_parser("plan", help="per-GPU memory a config needs (learner and actors), and whether it fits")
    plan.add_argument("args", nargs="*", help=spec)
    plan.add_argument("--gpus", type=int, default=None, help="GPUs available (learner ranks + actor GPUs must fit)")
    plan.add_argument("--gpu-mem", type=float, default=None, help="memory of one GPU in GB (1e9 bytes)")
    plan.add_argument("--prompt-tokens", type=int, default=256,
                      help="prompt length assumed when model.max_seq_len is unset (default 256)")
    plan.add_argument("--model-config", default=None, help="a config.json to read the model's shape from")
    keys = sub.add_parser("keys", help="make CurveZMQ key pairs for the learner and N actors")
    keys.add_argument("directory", help="folder to write (learner.key*, actor-<i>.key*, authorized/)")
    keys.add_argument("--actors", type=int, default=2, help="how many actor key pairs (default 2)")
    keys.add_argument("--force", action="store_true",
                      help="replace keys already in DIR (every old key, and every old authorized actor, goes)")
    plot = sub.add_parser("plot", help="r_count/r_loss (paper Figure 2), rewards, census and uplift plots as PNG")
    plot.add_argument("runs", nargs="+", help="run directories (runs/<name>)")
    plot.add_argument("--out", default=None, help="folder for the PNGs (default: the first run directory)")
    plot.add_argument("--window", type=int, default=10, help="steps per smoothing window (default 10)")
    reproduce = sub.add_parser("reproduce", help="train GRPO, static and CoRPO alike; write the paper's plot and table")
    reproduce.add_argument("args", nargs="*", help=spec)
    reproduce.add_argument("--out", default="runs/reproduce", help="folder for the three runs, figures and table")
    bench = sub.add_parser("bench", help="hot-path benchmarks, as ratios against same-run references")
    bench.add_argument("names", nargs="*",
                       choices=[*bench_names(), []],
                       help="default: all but trl (streamrl against TRL's GRPOTrainer; needs `pip install trl`)")
    bench.add_argument("--short", action="store_true", help="a quick pass that proves the benchmarks run")
    ev = sub.add_parser("eval", help="pass@k and mean@k of a saved policy, or (--live) of a running learner's")
    ev.add_argument("args", nargs="*", help="RUN_DIR or checkpoint folder (with --live: CONFIG or RUN_DIR), "
                    "then key=value overrides (e.g. eval.samples=16)")
    ev.add_argument("--live", action="store_true", help="subscribe to the learner's weights instead of a checkpoint")
    ev.add_argument("--learner", default=None, help="--live: learner host (default: transport.host)")
    ev.add_argument("--watch", type=int, default=1, help="--live: evaluate this many versions in all (default 1)")
    ev.add_argument("--timeout", type=float, default=120.0, help="--live: seconds to wait for weights (default 120)")
    ev.add_argument("--out", default=None, help="result file (default: RUN_DIR/eval.json)")
    diff = sub.add_parser("difficulty", help="keep the prompts whose success rate lies in [difficulty.low, .high]")
    diff.add_argument("args", nargs="*", help=spec)
    diff.add_argument("--out", required=True, help="JSONL to write: the kept dataset rows (or prompt ids)")
    diff.add_argument("--rollouts", type=int, default=None, help="samples per prompt (default: difficulty.rollouts)")
    diff.add_argument("--checkpoint", default=None, help="run dir or checkpoint folder (default: the initial policy)")
    diff.add_argument("--prompts", type=int, default=None,
                      help="tasks without a dataset: how many eval_set prompts (default: eval.prompts)")
    up = sub.add_parser("uplift", help="how training moved the likelihood of correct samples, by their initial rank")
    up.add_argument("args", nargs="*", help="RUN_DIR, then key=value overrides")
    up.add_argument("--prompts", type=int, default=64, help="training prompts to sample (default 64)")
    up.add_argument("--samples", type=int, default=64, help="samples per prompt from the initial policy (default 64)")
    up.add_argument("--buckets", type=int, default=5, help="rank buckets (default 5)")
    up.add_argument("--out", default=None, help="result file (default: RUN_DIR/uplift.json)")
    init = sub.add_parser("init", help="copy the shipped recipes, Slurm scripts and monitoring bundle into DIR")
    init.add_argument("directory", help="project folder to write (DIR/configs/, DIR/monitoring/; made if missing)")
    init.add_argument("--force", action="store_true", help="replace files already there (default: refuse)")
    ex = sub.add_parser("export", help="a checkpoint as a Hugging Face model folder (transformers, vllm serve)")
    ex.add_argument("run", metavar="RUN_DIR", help="runs/<name>, or one checkpoint folder runs/<name>/checkpoints/<tag>")
    ex.add_argument("out", metavar="OUT", help="folder to write (must not exist)")
    ex.add_argument("--step", type=int, default=None, help="the checkpoint at this step (default: the newest complete)")
    ex.add_argument("--merge", action="store_true",
                    help="LoRA: merge the adapters into the base weights (a full-weight checkpoint is already merged)")
    ex.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard (default 5GB)")
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

    name = {"learner": "learner", "actor": f"actor-{getattr(args, 'index', 0)}"}.get(args.command, args.command)
    if level is not None or args.command in ("learner", "actor"):  # the processes log at INFO unless told
        setup_logging(name, level or "INFO")
    if args.command == "init":
        from streamrl.commands import init

        try:
            made = init.init(args.directory, force=args.force)
        except OSError as e:
            print(f"streamrl init: error: {e}", file=sys.stderr)
            return 2
        print(f"streamrl init: wrote {len(made)} files to {args.directory}/ (configs/, monitoring/); try "
              f"`cd {args.directory} && streamrl run configs/tiny.yaml`")
        return 0
    if args.command == "keys":
        from streamrl.comm import security

        try:
            made = security.make_keys(args.directory, args.actors, force=args.force)
        except (ValueError, OSError) as e:
            print(f"streamrl keys: error: {e}", file=sys.stderr)
            return 2
        print(f"streamrl: wrote {len(made)} key files to {args.directory}/ (secret keys are *.key_secret, mode 600); "
              f"run learner and actors with transport.curve_keys={args.directory}")
        return 0
    if args.command == "bench":
        from streamrl.bench import cli as bench

        bench.run(args.names, short=args.short)
        return 0
    if args.command == "plot":
        from streamrl.commands import plots

        try:
            if args.window < 1:
                raise ValueError(f"--window {args.window}: must be at least 1 (steps per smoothing window)")
            made = plots.plot(args.runs, args.out or args.runs[0], args.window)
        except (FileNotFoundError, ValueError) as e:
            print(f"streamrl plot: {e}", file=sys.stderr)
            return 2
        print("streamrl plot: wrote " + ", ".join(map(str, made)))
        return 0
    if args.command in ("eval", "difficulty", "uplift"):
        return _tool(args)
    if args.command == "tasks":
        return list_tasks()
    if args.command == "export":
        return _export(args)
    try:
        path, overrides = split_args(args.args)
        if path is None and args.command in ("run", "check", "reproduce", "plan"):
            path = str(config_lib.DEFAULT_CONFIG) if config_lib.DEFAULT_CONFIG.is_file() else None
        cfg = config_lib.load(path, overrides)
        if args.command in ("check", "run", "learner", "actor"):  # a model that cannot load fails here, not 30 s in
            from streamrl.models.model import path_problem

            if problem := path_problem(cfg.model.path):
                raise config_lib.ConfigError(problem)
    except config_lib.ConfigError as e:
        msg = str(e)
        print(f"streamrl: {msg if msg.startswith('config error') else 'config error: ' + msg}", file=sys.stderr)
        return 2

    if args.command in preflight.ROLES and not before_start(cfg, args, name):
        return 2
    if args.command == "check":
        if (report := _task_report(cfg)) is None:
            return 2
        print(config_lib.dump(cfg) + report, end="")
        return 0
    if args.command == "plan":
        from streamrl.commands import plan as plan_lib

        try:
            made = plan_lib.make(cfg, args.gpus, args.gpu_mem, args.prompt_tokens, args.model_config)
        except (FileNotFoundError, ValueError) as e:
            print(f"streamrl plan: error: {e}", file=sys.stderr)
            return 2
        print(plan_lib.report(made, path or "default"))
        return 0 if made.fits is not False else 1
    if args.command == "reproduce":
        from streamrl.commands import reproduce

        return reproduce.run(path, overrides, args.out)
    if args.command == "run":
        from streamrl.commands import launch, plan

        if warning := plan.run_warning(cfg):
            print(f"streamrl: warning: {warning}", file=sys.stderr)

        try:
            return launch.run(cfg, overwrite=args.overwrite)
        except KeyboardInterrupt:  # before the supervisor took over the signals: nothing started yet
            print("\nstreamrl: interrupted", file=sys.stderr)
            return 130
    from streamrl.telemetry.startup import Phases

    phases = Phases(name)
    try:
        if args.command == "learner":
            if args.local_rank is not None:
                os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
            from streamrl.learner.main import run as run_learner

            phases.mark("imports")
            run_learner(cfg, phases)
        else:
            from streamrl.actors.main import run as run_actor

            phases.mark("imports")
            run_actor(cfg, index=args.index, learner_host=args.learner, phases=phases)
    except Exception as e:  # the traceback goes to the log; the last line says what went wrong
        from streamrl.run import storage

        logging.getLogger(f"streamrl.{name}").exception("failed")
        try:  # on a full disk the log itself may not take it: the exit status still says so
            print(f"streamrl {name}: error: {storage.reason(e)}", file=sys.stderr, flush=True)
        except OSError:
            pass
        return 1
    return 0


def _task_report(cfg: config_lib.Config) -> str | None:
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


def before_start(cfg: config_lib.Config, args, name: str) -> bool:
    """The checks of `streamrl.run.preflight` for this command: each problem one line on stderr; False stops it."""
    errors, warnings = preflight.problems(cfg, args.command, getattr(args, "index", 0))
    if args.command in ("check", "run"):  # before the claim: a refused run leaves no run directory behind
        data_errors, data_warnings = data_problems(cfg)
        errors += data_errors
        warnings += data_warnings
    claim = None if errors else run_claim(cfg, args)
    if claim:
        errors.append(claim)
    elif args.command == "learner" and os.environ.get("RANK", "0") == "0" and (refusal := preflight.existing_run(cfg)):
        if args.overwrite:
            if not errors:  # never a live run (it holds the lock) nor before every other check passed
                from streamrl.run import lock

                print(f"streamrl {name}: moved the earlier run aside to {preflight.move_aside(cfg.run_path)}",
                      file=sys.stderr)
                lock.take(cfg.run_path, "--overwrite")  # the held lock moved with the old run
        else:
            errors.append(refusal)
    if args.command == "check" and (refusal := preflight.existing_run(cfg)):
        errors.append(refusal.replace("pass --overwrite", "pass `streamrl run --overwrite`"))
    for w in warnings:
        print(f"streamrl {name}: warning: {w}", file=sys.stderr)
    for e in errors:
        print(f"streamrl {name}: error: {e}", file=sys.stderr)
    if not errors and cfg.transport.curve_keys and args.command == "check":
        print(f"streamrl check: CurveZMQ encryption and authentication on (keys in {cfg.transport.curve_keys})",
              file=sys.stderr)
    return not errors


def run_claim(cfg: config_lib.Config, args) -> str | None:
    """The run directory for this command (streamrl.run.lock, streamrl.run.fingerprint): `run` and a learner started
    alone (rank 0) lock it for their life; a locked run, or a resume whose settings would corrupt the run, is refused
    (one line). An accepted resume states the settings it changes and records them in the run."""
    from streamrl.run import fingerprint, lock

    name = "learner" if args.command == "learner" else args.command
    if args.command == "actor" or os.environ.get("RANK", "0") != "0" or lock.held_for_me(cfg.run_path):
        return None  # an actor, a learner's other rank, or a learner `streamrl run` started under its own lock
    purpose = ("--overwrite" if getattr(args, "overwrite", False) else "learner.resume=true" if cfg.learner.resume
               else "a second run")
    try:
        if args.command == "check":
            if holder := lock.live_holder(cfg.run_path):
                return f"{cfg.run_path} is in use by a live run ({holder})"
        else:
            lock.take(cfg.run_path, purpose)
    except lock.RunLocked as e:
        return str(e)
    if not cfg.learner.resume:
        return None
    if problem := fingerprint.resume_problem(cfg):
        return problem
    changes = fingerprint.compare(cfg)[1] if args.command == "check" else fingerprint.accept(cfg)
    if changes:
        print(f"streamrl {name}: resuming with changed settings (applied): {fingerprint.describe(changes)}",
              file=sys.stderr, flush=True)
    return None


def _tool(args) -> int:
    """Commands that read a run or sample a policy (eval, difficulty, uplift): a bad config, path or argument
    is one line and status 2."""
    try:
        path, overrides = split_args(args.args)
        out = Path(args.out) if args.out else None
        if args.command == "eval":
            from streamrl.commands import eval_cli

            if not args.live:
                if path is None:
                    raise config_lib.ConfigError("streamrl eval: give a RUN_DIR or checkpoint folder (or --live)")
                print(eval_cli.line(result := eval_cli.offline(path, overrides, out),
                                    out or _run_dir(path) / "eval.json"))
                return 0 if result else 1
            if args.watch < 1:
                raise config_lib.ConfigError(f"--watch {args.watch}: must be at least 1")
            cfg = _live_config(path, overrides)
            done = eval_cli.live(cfg, args.learner, args.watch, args.timeout, out)
            return 0 if done else 1
        if args.command == "difficulty":
            from streamrl.commands import difficulty

            if path is None and args.checkpoint:
                path = str(_run_dir(args.checkpoint) / "config.yaml")
            cfg = config_lib.load(path or str(config_lib.DEFAULT_CONFIG), overrides)
            for flag in ("rollouts", "prompts"):
                if (v := getattr(args, flag)) is not None and v < 1:
                    raise config_lib.ConfigError(f"--{flag} {v}: must be at least 1")
            c = difficulty.filter_offline(cfg, args.rollouts or cfg.difficulty.rollouts, Path(args.out),
                                          args.checkpoint, args.prompts)
            print(f"streamrl difficulty: kept {c['kept']} of {c['prompts']} prompts ({c['source']}); dropped "
                  f"{c['too_easy']} too easy (rate > {cfg.difficulty.high}), {c['too_hard']} too hard "
                  f"(rate < {cfg.difficulty.low}), {c['too_long']} too long (no room under model.max_seq_len, or "
                  f"over model.max_prompt_tokens: not sampled) -> {c['out']}")
            return 0
        if args.command == "uplift":
            from streamrl.commands import uplift

            if path is None:
                raise config_lib.ConfigError("streamrl uplift: give a RUN_DIR")
            for flag in ("prompts", "samples", "buckets"):
                if getattr(args, flag) < 1:
                    raise config_lib.ConfigError(f"--{flag} {getattr(args, flag)}: must be at least 1")
            result = uplift.analyse(path, overrides, args.prompts, args.samples, args.buckets, out)
            print(uplift.report(result))
            return 0
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
    raise AssertionError(args.command)


def _export(args) -> int:
    from streamrl.run import export

    try:
        done = export.export(args.run, args.out, args.step, args.merge, export.parse_size(args.max_shard_size))
    except (export.ExportError, config_lib.ConfigError) as e:
        print(f"streamrl export: error: {e}", file=sys.stderr)
        return 2
    print(f"streamrl export: wrote step {done.step} ({done.kind} model, {done.parameters:,} parameters, "
          f"{len(done.shards)} shard(s)) from {done.checkpoint} to {done.out}; load it with "
          f"AutoModelForCausalLM.from_pretrained({str(done.out)!r}) or `vllm serve {done.out}`")
    return 0


def _run_dir(path: str) -> Path:
    from streamrl.run import checkpoints

    return checkpoints.run_dir_of(path)


def _live_config(path: str | None, overrides: list[str]) -> config_lib.Config:
    """A run dir's config.yaml (it holds the ports `streamrl run` chose), or a CONFIG file, or the default."""
    if path is not None and Path(path).is_dir():
        path = str(_run_dir(path) / "config.yaml")
    return config_lib.load(path or str(config_lib.DEFAULT_CONFIG), overrides)


if __name__ == "__main__":
    sys.exit(main())


def list_tasks() -> int:
    """`streamrl tasks`: each installed task's name and origin (entry point and distribution)."""
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


def data_problems(cfg: config_lib.Config) -> tuple[list[str], list[str]]:
    """(errors, warnings) of the task's reward functions (each must import) and data files, every row read through
    its row check (streaming, `streamrl.tasks.data.scan`): each malformed row is a warning naming its file and row
    (the first `data.SHOWN`, then how many more), since a run skips them; a source that cannot be read or holds
    no usable row is an error. `check` and `run` both print these, before the run directory is claimed."""
    from streamrl.tasks import TASKS, data

    errors, warnings = [], []
    if cfg.task.reward:  # a reward that cannot be found fails here, not in every actor
        from streamrl.tasks.reward_functions import resolve

        for ref in [cfg.task.reward] if isinstance(cfg.task.reward, str) else cfg.task.reward:
            try:
                resolve(ref)
            except ValueError as e:
                errors.append(str(e))
    cls = TASKS.get(cfg.task.name)
    if not hasattr(cls, "row_converter"):
        return errors, warnings
    sources = {f"task.{key}": getattr(cfg.task, key) for key in ("data", "eval_data")}
    sources.update({f"eval.sets.{name}": path for name, path in cfg.eval.sets.items()})
    for key, source in sources.items():
        if not source:
            continue
        try:
            got = data.scan(source, cls.row_converter(cfg.task), cfg.task.max_row_bytes)
        except (ValueError, OSError) as e:
            errors.append(f"{key}: {e}")
            continue
        warnings += [str(p) for p in got.problems]
        if got.count > len(got.problems):
            warnings.append(f"{key}={source}: and {got.count - len(got.problems):,} more malformed rows "
                            "(fix those above and check again)")
        total = got.usable + got.count
        if not got.usable:
            errors.append(f"{key}={source}: no usable row of {total:,}")
        elif got.count:
            warnings.append(f"{key}={source}: {got.count:,} of {total:,} rows have a problem; a run skips them")
    return errors, warnings
