"""The supervisor of `streamrl run`: it starts the learner and the actors, watches them to the end and stops them.

Children run in their own sessions, so Ctrl-C reaches only the supervisor, which asks the learner to stop
cleanly (it finishes the step, checkpoints, tells the actors to exit) and then makes sure no child is left
behind. Progress is read from the learner's metrics.jsonl; what the run waits for is said every WAIT_NOTE_S.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

from streamrl.commands import forked
from streamrl.config import Config
from streamrl.registry import BACKENDS
from streamrl.run import lifecycle
from streamrl.telemetry.startup import Phases


class Supervisor:
    """One run's processes on this machine. `start` them, `watch` until the learner exits (progress, waits, failed
    actors, Ctrl-C), `stop` whatever is left (always: in a `finally`), then `report` the exit status."""

    def __init__(self, cfg: Config, cfg_file: Path, learner_env: dict[str, str], actor_envs: list[dict[str, str]],
                 spawn: Callable, out):
        self.cfg, self.cfg_file, self.run_dir, self.out = cfg, cfg_file, cfg.run_path, out
        self.learner_env, self.actor_envs, self.spawn = learner_env, actor_envs, spawn
        self.learner: subprocess.Popen | None = None
        self.actors: list[subprocess.Popen] = []
        self.waits = _Waits(self.logs / "learner.log", out)
        self.interrupts, self.signalled = 0, None
        self.failure: str | None = None
        self.reported: set[int] = set()  # the actors whose failure is told
        self.orphaned_since: float | None = None  # when the last actor this command started failed
        # A resumed run's metrics.jsonl holds the earlier steps: they are not shown as new progress.
        self.old_lines = _line_hashes(self.run_dir / "metrics.jsonl") if cfg.learner.resume else set()
        self.tail = _Tail(self.run_dir / "metrics.jsonl")
        # A resumed run's summary.json is the previous life's until this learner writes its own: never this one's
        # outcome (a learner that failed before writing one says why in its log instead).
        self.summary_before = _read_bytes(self.run_dir / "summary.json")
        self.handlers: dict = {}

    @property
    def logs(self) -> Path:
        return self.run_dir / "logs"

    def say(self, line: str) -> None:
        print(f"streamrl: {line}", file=self.out, flush=True)

    def start(self, phases: Phases) -> None:
        # Before any child exists: a Ctrl-C during start-up stops the run like one later.
        self.handlers = {s: signal.signal(s, self.on_interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
        if signum := lifecycle.stop_asked():  # during the launcher's own start-up (streamrl/__main__.py)
            self.on_interrupt(signum, None)
        phases.mark("configured")
        # On CPU the children are forked from this process once it has imported what they all need:
        # those imports are most of their start-up, and 2 cores would otherwise do them three times.
        cfg = self.cfg
        fork = forked.enabled() and BACKENDS.can(cfg.actors.backend, "cpu_fork") and not self.learner_env and not any(self.actor_envs)
        if fork:
            forked.preload(cfg)
            phases.mark("imports")
        self.learner = self.spawn(["learner", str(self.cfg_file)], self.logs / "learner.log", cfg.learner.ranks,
                                  self.learner_env, fork=fork)
        if self.interrupts:  # stopped during start-up: the learner writes a true (empty) summary, no actor starts
            self.learner.send_signal(signal.SIGTERM)
            return
        self.actors = [self.spawn(["actor", str(self.cfg_file), "--index", str(i)], self.logs / f"actor-{i}.log",
                                  env_extra=self.actor_envs[i], fork=fork)
                       for i in range(cfg.actors.num)]
        phases.mark("spawned")
        phases.done(self.run_dir)

    def on_interrupt(self, signum, frame) -> None:
        self.interrupts += 1
        self.signalled = self.signalled or signum
        print("\nstreamrl: stopping (Ctrl-C again to kill)" if self.interrupts == 1 else "\nstreamrl: killing",
              file=self.out, flush=True)
        if self.interrupts == 1:
            self.waits.stopping()
            if self.learner is not None:
                self.learner.send_signal(signal.SIGTERM)
        else:
            for p in self.started:
                p.kill()

    @property
    def started(self) -> list[subprocess.Popen]:
        return [self.learner, *self.actors] if self.learner is not None else []

    def watch(self) -> None:
        while self.learner.poll() is None:
            self.show_progress()
            if self.interrupts == 1 or self.failure is not None:
                # Stopped or hung: after one Ctrl-C the learner is killed once overdue, so the run still ends.
                if (limit := self.waits.stop_overdue(self.learner.pid)) is not None:
                    self.say(f"the learner did not stop within {limit:.0f}s; killing it")
                    _kill(self.learner)
                    continue
            else:
                self.waits.tell(sum(p.poll() is None for p in self.actors), len(self.actors))
            self.check_actors()
            time.sleep(0.2)
        self.show_progress()
        _stop_all(self.actors, grace_s=10.0)  # they exit on the learner's shutdown notice; this is the backstop

    def show_progress(self) -> None:
        cfg = self.cfg
        for line in self.tail.lines():
            if hash(line) in self.old_lines:
                continue
            self.waits.progressed()
            rec = json.loads(line)
            if (rec["step"] + 1) % cfg.log_every == 0 or rec["step"] == 0 or rec["step"] + 1 == cfg.steps:
                print(progress_line(rec, cfg.steps, cfg.max_staleness), file=self.out, flush=True)

    def check_actors(self) -> None:
        for i, p in enumerate(self.actors):
            if p.poll() not in (None, 0) and i not in self.reported:
                self.reported.add(i)
                if self.interrupts < 2:
                    self.say(_child_failure(f"actor-{i}", p.returncode, self.logs / f"actor-{i}.log"))
        # An actor that exits 0 has had the learner's shutdown notice: only all of them failing is fatal, and only
        # once the learner has no live actor either: one started by hand (`streamrl actor`) joins the run too,
        # and while its groups arrive the learner steps.
        if not self.actors or self.failure is not None or len(self.reported) < len(self.actors):
            return
        if self.orphaned_since is None:
            self.orphaned_since = time.monotonic()
            if self.interrupts < 2:
                self.say("every actor this command started has failed; the run goes on while the learner still "
                         f"steps (an actor started elsewhere), and stops after {self.waits.silence_limit():.0f}s "
                         "without a step")
        if self.waits.silent_for() > self.waits.silence_limit():
            self.failure = "every actor failed"
            self.say(f"{self.failure}; stopping the learner")
            self.waits.stopping()
            self.learner.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        _stop_all(self.started, grace_s=5.0)
        for s, h in self.handlers.items():
            signal.signal(s, h)

    def report(self) -> int:
        """The exit status (launch.EXIT_STATUSES), once the learner has exited; its line, and the run's summary."""
        summary_path, learner_log = self.run_dir / "summary.json", self.logs / "learner.log"
        s = _read_summary(summary_path) if _read_bytes(summary_path) != self.summary_before else None
        if s is None and self.learner.returncode < 0:  # killed before it could write its own: the record says so
            _write_killed_summary(summary_path, self.run_dir,
                                  _child_failure("learner", self.learner.returncode, learner_log))
        code, line = outcome(self.learner.returncode, s, self.signalled, self.failure, learner_log)
        if line is not None:
            self.say(line)
        if s is not None and (broken := s.get("user_code_failure")):  # the user's own bug: its traceback, here
            self.say(f"the first failure of {broken.get('kind', 'reward function')} {broken['function']} "
                     f"({broken['reason']}, in {broken['actor']}):\n"
                     f"{broken['traceback']}\nevery count: {broken['counts']}")
        if self.interrupts >= 2:
            self.say(f"killed the learner and actors; the newest complete checkpoint is "
                     f"{_newest_checkpoint(self.run_dir) or 'none'}")
        elif s is not None and code != 1:
            self.say(f"{'done' if code == 0 else 'stopped'} in {s['wall_s']:.0f}s: {s['steps']} steps, "
                     f"reward {_fmt(s['reward_first_10pct'], '.3f')} (first 10%) -> "
                     f"{_fmt(s['reward_last_10pct'], '.3f')} (last 10%); groups used {s['groups_used']}, "
                     f"dropped {s['groups_dropped']}, rejected {s['messages_rejected']}{_reward_failures(s)}; "
                     f"summary: {summary_path}")
            if (m := s.get("mgrpo_layer2")) and m["first_correction_step"] is not None:
                self.say(f"layer 2 trained on {m['steps_with_layer2']} of the {m['steps_since']} steps from the "
                         f"first verified correction (step {m['first_correction_step']}) on, {m['layer2_groups']} "
                         "groups")
        return code


class _Tail:
    """Reads the complete lines appended to a file since the last call."""

    def __init__(self, path: Path):
        self.path, self.pos, self.buf = path, 0, ""

    def lines(self) -> list[str]:
        if not self.path.exists():
            return []
        with open(self.path) as f:
            if f.seek(0, os.SEEK_END) < self.pos:  # rewritten (a resumed learner trims its log)
                self.pos, self.buf = 0, ""
            f.seek(self.pos)
            self.buf += f.read()
            self.pos = f.tell()
        *done, self.buf = self.buf.split("\n")
        return [line for line in done if line.strip()]


def _fmt(v, spec: str) -> str:
    return "  -  " if v is None else format(v, spec)


def progress_line(rec: dict, steps: int, max_staleness: int) -> str:
    dropped = sum(rec.get("groups_dropped", {}).values())
    return (f"step {rec['step'] + 1:>5}/{steps}  reward {_fmt(rec['reward_mean'], '.3f')}  "
            f"r_count {_fmt(rec['r_count'], '.3f')}  failed+ {_fmt(rec['failed_positive_fraction'], '.3f')}  "
            f"lag {rec['lag_mean']:.2f} (max {rec['lag_max']}/{max_staleness})  "
            f"{_fmt(rec['samples_per_s'], '.0f')} samples/s  dropped {dropped}  [{rec['elapsed_s']:.0f}s]"
            + _reward_failures(rec))


def _reward_failures(rec: dict) -> str:
    """'  reward failures {...}' whenever the user's reward functions failed at all (samples by reason; calls_failed:
    calls), else ''."""
    return f"  reward failures {rec['reward_failures']}" if rec.get("reward_failures") else ""


def _stop_all(procs: list[subprocess.Popen], grace_s: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _first_error_line(log: Path, who: str) -> str | None:
    """The one line a failed `streamrl learner`/`actor` ends its log with (`streamrl NAME: error: ...`)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    marker = f"streamrl {who}: error: "
    return next((line.split(marker, 1)[1] for line in reversed(lines) if marker in line), None)


def _child_failure(who: str, returncode: int, log: Path) -> str:
    """One line: why a child ended, and the log with its traceback."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"{who} was killed by {name} (its log: {log})"
    if (line := _first_error_line(log, who)) is not None:
        return f"{who} failed: {line} (traceback in {log})"
    return f"{who} exited with status {returncode} (see {log})"


def outcome(learner_rc: int, summary: dict | None, signalled: int | None, failure: str | None,
            learner_log: Path) -> tuple[int, str | None]:
    """(exit status, one line or None) once the learner has exited; see EXIT_STATUSES."""
    if summary is not None and summary.get("status") == "failed":
        where = f" (traceback in {learner_log})"
        return 1, f"learner failed: {summary.get('error', 'see the log')}{where}"
    if learner_rc != 0:
        if signalled is not None and learner_rc == -signal.SIGKILL:  # the second Ctrl-C killed it
            return 128 + signalled, None
        return 1, _child_failure("learner", learner_rc, learner_log)
    if signalled is not None:
        return 128 + signalled, None
    if failure is not None:
        return 3, None
    if summary is None or summary.get("status") != "finished":
        return 4, "the learner stopped before its steps (it was stopped from outside this command)"
    return 0, None


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _read_summary(path: Path) -> dict | None:
    try:
        s = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return s if isinstance(s, dict) and s.get("status") != "running" else None


STOP_GRACE_S = 30.0  # a learner asked to stop that is not running at all (SIGSTOP, traced) is killed after this
STOP_LIMIT_S = 300.0  # any learner asked to stop is killed after this (a big model's final checkpoint fits in it)
ORPHAN_GRACE_S = 20.0  # every started actor failed: the run stops after this long with no step (or 3× recent gaps)
WAIT_NOTE_S = 15.0  # with no new step for this long, the supervisor says what the run is waiting for


class _Waits:
    """What `streamrl run` says while nothing visible happens: what the run waits for, every WAIT_NOTE_S."""

    def __init__(self, learner_log: Path, out):
        self.learner_log, self.out = learner_log, out
        self.since = self.last_note = time.monotonic()
        self.stop_asked: float | None = None
        self.steps = 0
        self.gaps: collections.deque[float] = collections.deque(maxlen=20)  # between recent steps

    def progressed(self) -> None:
        now = time.monotonic()
        if self.steps:
            self.gaps.append(now - self.since)
        self.since = self.last_note = now
        self.steps += 1

    def silent_for(self) -> float:
        """Seconds since the last new step (or the start)."""
        return time.monotonic() - self.since

    def silence_limit(self) -> float:
        """How long without a step means no actor is feeding the learner: ORPHAN_GRACE_S, or 3× the longest recent
        gap between steps (a big model's steps take minutes)."""
        return max(ORPHAN_GRACE_S, 3 * max(self.gaps, default=0.0))

    def stopping(self) -> None:
        self.stop_asked = self.stop_asked or time.monotonic()

    def stop_overdue(self, pid: int) -> float | None:
        """The seconds after which the learner (process `pid`), asked to stop, is overdue and is killed; None
        while it is not."""
        now = time.monotonic()
        frozen = _process_state(pid) in ("T", "t")  # stopped or traced: it cannot stop by itself
        limit = STOP_GRACE_S if frozen else STOP_LIMIT_S
        if now - self.last_note > WAIT_NOTE_S:
            self.last_note = now
            state = "it is stopped (SIGSTOP) and cannot" if frozen else "it finishes its step and checkpoints"
            print(f"streamrl: waiting for the learner to stop ({state}; killed after {limit:.0f}s) "
                  f"[{now - self.stop_asked:.0f}s]", file=self.out, flush=True)
        return limit if now - self.stop_asked > limit else None

    def tell(self, alive: int, actors: int) -> None:
        now = time.monotonic()
        if now - self.last_note < WAIT_NOTE_S:
            return
        self.last_note = now
        try:
            ready = "learner ready" in self.learner_log.read_text(errors="replace")
        except OSError:
            ready = False
        what = ("the learner's start (model, DeepSpeed, sockets)" if not ready else
                f"{'the first' if not self.steps else 'the next'} step: the learner waits for groups from the "
                f"actors ({alive} of {actors} running; their logs: {self.learner_log.parent}/actor-*.log)")
        print(f"streamrl: waiting for {what} [{now - self.since:.0f}s]", file=self.out, flush=True)


def _process_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat (R, S, D, T, Z, ...); "" when it cannot be read."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _kill(p) -> None:
    try:
        p.send_signal(signal.SIGCONT)  # a stopped process dies only once it runs again
        p.kill()
    except (ProcessLookupError, OSError):
        pass
    p.wait()


def _write_killed_summary(path: Path, run_dir: Path, why: str) -> None:
    """summary.json for a learner that died by a signal (its own summary never got written)."""
    from streamrl.run import jsonfiles

    try:
        with open(run_dir / "metrics.jsonl") as f:
            steps = sum(1 for line in f if line.strip())
    except OSError:
        steps = 0
    try:
        jsonfiles.write(path, {"status": "failed", "error": why, "steps": steps, "stopped_early": True,
                               "written_by": "streamrl run (the learner could not write it)"})
    except OSError:
        pass


def _line_hashes(path: Path) -> set[int]:
    try:
        with open(path) as f:
            return {hash(line.rstrip("\n")) for line in f if line.strip()}
    except OSError:
        return set()


def _newest_checkpoint(run_dir: Path) -> str | None:
    from streamrl.run import checkpoints

    found = checkpoints.newest_complete(run_dir / "checkpoints")
    return str(run_dir / "checkpoints" / found[0]) if found else None
