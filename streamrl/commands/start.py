"""What `check`, `run`, `learner` and `actor` verify before anything starts (`streamrl.run.preflight`), and the run
directory they claim: each problem is one line on stderr, and any error is status 2."""

from __future__ import annotations

import os
import sys

from streamrl import config as config_lib
from streamrl.run import preflight


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
    if args.command == "check" and (refusal := preflight.existing_run(cfg)):  # what `run` would say; check goes on
        warnings.append(refusal.replace(
            "pass --overwrite", "pass `streamrl run --overwrite`") + " (`streamrl run` would refuse it)")
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
    if problem := fingerprint.resume_problem(cfg) or data_cursor_problem(cfg):  # before anything is written
        return problem
    changes = fingerprint.compare(cfg)[1] if args.command == "check" else fingerprint.accept(cfg)
    if changes:
        print(f"streamrl {name}: resuming with changed settings (applied): {fingerprint.describe(changes)}",
              file=sys.stderr, flush=True)
    return None


def data_cursor_problem(cfg: config_lib.Config) -> str | None:
    """With task.epochs, a resume whose rows or seed are not those its newest complete checkpoint's data cursor was
    dealt from (edited data, another seed, fewer epochs than it is in): one line, as the learner would refuse it,
    but before the run directory is touched. None when it may go on, or when the learner itself must say (no
    cursor, an unreadable one, data it cannot load)."""
    import json

    from streamrl import tasks
    from streamrl.run import checkpoints
    from streamrl.tasks import dealer

    if not cfg.task.epochs or (found := checkpoints.newest_complete(cfg.run_path / "checkpoints")) is None:
        return None
    try:
        cursor = json.loads((cfg.run_path / "checkpoints" / found[0] / dealer.CURSOR).read_text())
        task = tasks.build(cfg.task)
        ids = [task.prompt(r).id for r in task.train]
    except Exception:  # the learner's own resume names what is wrong with the cursor or the data
        return None
    problem = dealer.cursor_problem(cursor, len(ids), cfg.seed, cfg.task.epochs, dealer.digest(ids),
                                    f"task.data={cfg.task.data}")
    return problem and f"learner.resume=true (checkpoint {found[0]}): {problem}"


def data_problems(cfg: config_lib.Config) -> tuple[list[str], list[str]]:
    """(errors, warnings) of the task's reward functions (each must import) and data files, every row read through
    its row check (streaming, `streamrl.tasks.data.scan`): each malformed row is a warning naming its file and row
    (the first `data.SHOWN`, then how many more), since a run skips them; a source that cannot be read or holds
    no usable row is an error. `check` and `run` both print these, before the run directory is claimed."""
    from streamrl.tasks import TASKS, data
    from streamrl.tasks.base import optional

    errors, warnings = [], []
    if cfg.task.reward:  # a reward that cannot be found fails here, not in every actor
        from streamrl.tasks.reward_functions import resolve

        for ref in [cfg.task.reward] if isinstance(cfg.task.reward, str) else cfg.task.reward:
            try:
                resolve(ref)
            except ValueError as e:
                errors.append(str(e))
    row_converter = optional(TASKS.get(cfg.task.name), "row_converter")
    if row_converter is None:
        return errors, warnings
    sources = {f"task.{key}": getattr(cfg.task, key) for key in ("data", "eval_data")}
    sources.update({f"eval.sets.{name}": path for name, path in cfg.eval.sets.items()})
    for key, source in sources.items():
        if not source:
            continue
        try:
            got = data.scan(source, row_converter(cfg.task), cfg.task.max_row_bytes)
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
