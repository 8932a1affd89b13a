"""The `streamrl` command.

  streamrl run [CONFIG] [key=value ...]        learner + actors on this machine, with progress (exit statuses below)
  streamrl learner CONFIG [key=value ...]      one learner (also under `deepspeed` or `torchrun`)
  streamrl actor CONFIG --learner HOST [...]   one actor
  streamrl check [CONFIG] [key=value ...]      validate and print the resolved config
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
    from streamrl.commands import bench

    return [*bench.BENCHES, *bench.OPTIONAL]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamrl", description="Asynchronous RL with ordinal rewards and CoRPO.")
    sub = p.add_subparsers(dest="command", required=True)
    spec = "[CONFIG] [key=value ...]: a YAML file from configs/ (default: the tiny CPU job) and dotted overrides"
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
    ex = sub.add_parser("export", help="a checkpoint as a Hugging Face model folder (transformers, vllm serve)")
    ex.add_argument("run", metavar="RUN_DIR", help="runs/<name>, or one checkpoint folder runs/<name>/checkpoints/<tag>")
    ex.add_argument("out", metavar="OUT", help="folder to write (must not exist)")
    ex.add_argument("--step", type=int, default=None, help="the checkpoint at this step (default: the newest complete)")
    ex.add_argument("--merge", action="store_true",
                    help="LoRA: merge the adapters into the base weights (a full-weight checkpoint is already merged)")
    ex.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard (default 5GB)")
    return p


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
        from streamrl.commands import bench

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

    from streamrl.run.lifecycle import setup_logging

    name = {"learner": "learner", "actor": f"actor-{getattr(args, 'index', 0)}"}.get(args.command, args.command)
    if args.command in preflight.ROLES and not before_start(cfg, args, name):
        return 2
    if args.command == "check":
        print(config_lib.dump(cfg), end="")
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
    setup_logging(name)
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


def before_start(cfg: config_lib.Config, args, name: str) -> bool:
    """The checks of `streamrl.run.preflight` for this command: each problem one line on stderr; False stops it."""
    errors, warnings = preflight.problems(cfg, args.command, getattr(args, "index", 0))
    if args.command == "learner" and os.environ.get("RANK", "0") == "0" and (refusal := preflight.existing_run(cfg)):
        if args.overwrite:
            print(f"streamrl {name}: moved the earlier run aside to {preflight.move_aside(cfg.run_path)}",
                  file=sys.stderr)
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
                  f"(rate < {cfg.difficulty.low}) -> {c['out']}")
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
