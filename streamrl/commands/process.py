"""`streamrl learner` and `streamrl actor`: one process of a run, started by hand, by a launcher (deepspeed,
torchrun, Slurm) or as a child of `streamrl run`."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from streamrl.commands import options, start


def add_parser(subparsers) -> None:
    learner = subparsers.add_parser("learner", help="run one learner process")
    options.add_config(learner)
    learner.add_argument("--local_rank", "--local-rank", type=int, default=None, help="set by the deepspeed launcher")
    learner.add_argument("--overwrite", action="store_true", help=options.OVERWRITE_HELP)
    actor = subparsers.add_parser("actor", help="run one actor process")
    options.add_config(actor)
    actor.add_argument("--learner", default=None, help="learner host (default: transport.host)")
    actor.add_argument("--index", type=int, default=0, help="actor index: its id and seed")


def main(args: argparse.Namespace) -> int:
    name = options.process_name(args)
    if (loaded := options.load(args, default=False, model_check=True)) is None:
        return 2
    cfg = loaded[2]
    if not start.before_start(cfg, args, name):
        return 2
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
    if args.command == "learner" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _exit_at_once()
    return 0


def _exit_at_once() -> None:
    """A rank of a multi-rank learner whose work is done, saved and closed leaves without the interpreter's teardown:
    there a collective backend's threads can be destroyed while joinable and abort the process ("terminate called
    without an active exception", exit -6), which would report a finished run as failed (seen in the long tests)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
