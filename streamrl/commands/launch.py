"""`streamrl run`: one learner and N actors as OS processes on this machine, with live progress.

Children run in their own sessions, so Ctrl-C reaches only this supervisor, which asks the
learner to stop cleanly (it finishes the step, checkpoints, tells the actors to exit) and then
makes sure no child is left behind. Progress is read from the learner's metrics.jsonl.

The exit status says how the run ended (EXIT_STATUSES, shown by `streamrl run --help`); a failure
is one line naming what failed and the log that holds its traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from streamrl import config as config_lib
from streamrl import resources
from streamrl.commands import forked, options, start
from streamrl.config import Config
from streamrl.run import fingerprint, lock, preflight
from streamrl.run.placement import actor_gpus
from streamrl.telemetry.startup import SPAWNED_AT, Phases

EXIT_STATUSES = [
    (0, "the run finished all its steps"),
    (1, "the learner failed or was killed (the line before says why, and which log has the traceback)"),
    (2, "nothing started: a config error or a problem found before start (run_dir, ports, keys, existing run)"),
    (3, "every actor failed, so the run was stopped"),
    (4, "the learner stopped before its steps without failing (it was stopped from outside this command)"),
    (130, "interrupted by Ctrl-C (SIGINT); a second Ctrl-C kills the processes and also exits 130"),
    (143, "stopped by SIGTERM"),
]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("run", help="run the learner and the configured actors on this machine",
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog="exit status:\n" + "\n".join(f"  {code:>3}  {what}" for code, what in EXIT_STATUSES))
    options.add_config(p)
    p.add_argument("--overwrite", action="store_true", help=options.OVERWRITE_HELP)


def main(args: argparse.Namespace) -> int:
    if (loaded := options.load(args, model_check=True)) is None:
        return 2
    cfg = loaded[2]
    if not start.before_start(cfg, args, "run"):
        return 2
    from streamrl.commands import plan

    if warning := plan.run_warning(cfg):
        print(f"streamrl: warning: {warning}", file=sys.stderr)
    try:
        return run(cfg, overwrite=args.overwrite)
    except KeyboardInterrupt:  # before the supervisor took over the signals: nothing started yet
        print("\nstreamrl: interrupted", file=sys.stderr)
        return 130


def free_ports(n: int) -> list[int]:
    """n distinct ports free right now, chosen below the kernel's ephemeral range: a port handed out
    by bind(0) is free only until some outgoing connection (a Prometheus scrape, say) takes it as its
    source port, while ports below the range are never used that way."""
    try:
        low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError):
        low = 32768
    rng = random.Random()
    ports: list[int] = []
    while len(ports) < n:
        port = rng.randrange(20000, max(low, 20001))
        if port in ports or 29600 <= port < 29700:  # streamrl's own defaults (metrics ports among them)
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    return ports


def with_free_ports(cfg: Config) -> Config:
    """Port 0 means 'any free port', resolved here so learner and actors agree on it."""
    t = cfg.transport
    keys = [k for k in ("group_port", "weights_port", "weights_request_port", "weight_sync_port") if not getattr(t, k)]
    ports = dict(zip(keys, free_ports(len(keys))))
    return msgspec.structs.replace(cfg, transport=msgspec.structs.replace(t, **ports))


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
            f"{_fmt(rec['samples_per_s'], '.0f')} samples/s  dropped {dropped}  [{rec['elapsed_s']:.0f}s]")


def gpu_devices_present(dev: str = "/dev") -> bool:
    """Whether this machine could have a GPU torch sees: an NVIDIA (/dev/nvidia0, ...) or ROCm
    (/dev/kfd) device node, and CUDA_VISIBLE_DEVICES not -1. False means torch.cuda would count 0,
    so the launcher need not import torch to ask."""
    try:
        nodes = os.listdir(dev)
    except OSError:
        return True  # cannot tell: ask torch
    if os.environ.get("CUDA_VISIBLE_DEVICES", "").strip() in ("-1",):
        return False
    return "kfd" in nodes or any(n.startswith("nvidia") and n[6:].isdigit() for n in nodes)


def visible_gpus() -> list[str]:
    """This machine's usable GPUs as CUDA_VISIBLE_DEVICES entries (the launcher's own list, if it
    has one, so a supervisor confined to GPUs 4-7 hands out only those)."""
    if not gpu_devices_present():
        return []  # torch is not imported for nothing: 2-3 s of CPU before any child could start
    try:
        import torch

        count = torch.cuda.device_count()
    except Exception:  # no torch build with CUDA, no driver: no GPUs
        return []
    parent = os.environ.get("CUDA_VISIBLE_DEVICES")
    if parent is None:
        return [str(i) for i in range(count)]
    return [e.strip() for e in parent.split(",") if e.strip()][:count]


def gpu_plan(cfg: Config, gpus: list[str]) -> tuple[dict[str, str], list[dict[str, str]]]:
    """CUDA_VISIBLE_DEVICES for the learner and for each actor of a run on this machine.

    The learner's ranks take the first `learner.ranks` GPUs; the actors share out the rest, each
    on `actors.tensor_parallel_size` GPUs of its own (streamrl.run.placement.actor_gpus: actor i takes
    slot i mod the number of slots, so more actors than slots share). With too few GPUs left for
    one actor, the actors use all GPUs alongside the learner (one GPU: everything on it). No GPUs,
    or CPU actors: nothing is set."""
    if not gpus:
        return {}, [{} for _ in range(cfg.actors.num)]
    ranks = cfg.learner.ranks
    if ranks > len(gpus):  # each rank takes cuda:LOCAL_RANK, and NCCL refuses two ranks on one GPU
        raise config_lib.ConfigError(f"learner.ranks={ranks}: each learner rank needs a GPU of its own, this machine "
                                     f"has {len(gpus)} (allowed: 1..{len(gpus)})")
    learner = {"CUDA_VISIBLE_DEVICES": ",".join(gpus[:ranks])}
    if cfg.actors.backend == "hf" and cfg.actors.device == "cpu":
        return learner, [{} for _ in range(cfg.actors.num)]
    tp = cfg.actors.tensor_parallel_size if cfg.actors.backend != "hf" else 1  # hf generates on one GPU
    pool = gpus[ranks:] if len(gpus) - ranks >= tp else gpus
    if tp > len(pool):
        raise config_lib.ConfigError(f"actors.tensor_parallel_size={tp}: each actor needs {tp} GPUs, "
                                     f"this machine has {len(gpus)}")
    usable = len(pool) // tp * tp
    actors = [{"CUDA_VISIBLE_DEVICES": ",".join(pool[g] for g in actor_gpus(i, tp, usable))}
              for i in range(cfg.actors.num)]
    if cfg.actors.backend in ("vllm", "sglang"):
        shared_gpu_problem(cfg, gpus[:ranks], [a["CUDA_VISIBLE_DEVICES"].split(",") for a in actors])
    return learner, actors


# What the engines on one GPU may reserve together: the rest is for CUDA contexts; beside the learner,
# half of the GPU stays the learner's (`streamrl plan` tells whether that is enough for it).
SHARED_GPU_BUDGET, BESIDE_LEARNER_BUDGET = 0.9, 0.5


def shared_gpu_problem(cfg: Config, learner_gpus: list[str], engine_gpus: list[list[str]]) -> None:
    """Refuse a placement where vllm/sglang engines share a GPU (with each other or the learner) and would
    reserve more than it has: each reserves actors.gpu_memory_fraction of it (unset: the engine's own
    default, vLLM 0.92, which leaves nothing for a second process)."""
    from collections import Counter

    engines = Counter(g for gs in engine_gpus for g in gs)
    for gpu, n in sorted(engines.items()):
        shared = n > 1 or gpu in learner_gpus
        if not shared:
            continue
        with_learner = " and the learner" if gpu in learner_gpus else ""
        frac = cfg.actors.gpu_memory_fraction
        most = (BESIDE_LEARNER_BUDGET if gpu in learner_gpus else SHARED_GPU_BUDGET) / n
        if frac is None:
            raise config_lib.ConfigError(
                f"GPU {gpu} runs {n} {cfg.actors.backend} engine(s){with_learner}: set actors.gpu_memory_fraction "
                f"(each engine's share of the GPU; at most {most:.2f} here), else each reserves its default "
                "(vLLM 0.92) and the second process cannot start")
        if frac > most:
            raise config_lib.ConfigError(
                f"actors.gpu_memory_fraction={frac:g}: GPU {gpu} runs {n} {cfg.actors.backend} engine(s){with_learner}, "
                f"so each may take at most {most:.2f} of it")


def _compose_file() -> str:
    """The dashboard's compose file: this folder's own copy (a checkout, or `streamrl init`), else the shipped one
    (its mounts are relative to itself, so it runs from site-packages too)."""
    own = Path("monitoring") / "compose.yml"
    return str(own) if own.is_file() else str(resources.monitoring_dir() / "compose.yml")


def spawn(args: list[str], log_path: Path, ranks: int = 1, env_extra: dict[str, str] | None = None,
          fork: bool = False) -> subprocess.Popen | forked.Forked:
    """`streamrl ARGS` in a session of its own; with ranks > 1 under torchrun, one process per rank.
    `env_extra` adds to (or overrides) the inherited environment, e.g. the process's GPUs.
    fork: forked from this process (after `forked.preload`) instead of a fresh interpreter."""
    with open(log_path, "a") as log:  # where this start begins in a log a resumed run appends to
        log.write(f"--- streamrl {' '.join(args)} started {time.strftime('%Y-%m-%d %H:%M:%S')} (pid of the "
                  f"supervisor {os.getpid()})\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", SPAWNED_AT: repr(time.time()), lock.HELD_BY: str(os.getpid()),
           **(env_extra or {})}
    if fork and ranks == 1:
        return forked.spawn(args, log_path, env, _die_with_parent)
    launcher = [sys.executable, "-m", "streamrl"]
    if ranks > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
                    "--master_port", str(free_ports(1)[0]), "-m", "streamrl"]
    with open(log_path, "a") as log:  # the child keeps its own copy; a resumed run's log goes on after the old one
        return subprocess.Popen([*launcher, *args], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, env=env,
                                preexec_fn=_die_with_parent)


def _die_with_parent() -> None:
    """In the child: SIGTERM when the launching process dies, even by SIGKILL, so no learner or
    actor is left running on its own (Linux; elsewhere the parent's own cleanup has to do)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


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


def _read_summary(path: Path) -> dict | None:
    try:
        s = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return s if isinstance(s, dict) and s.get("status") != "running" else None


def run(cfg: Config, out=sys.stdout, overwrite: bool = False) -> int:
    phases = Phases("run")  # from this process's start (or STREAMRL_SPAWNED_AT: a bench timing the command)
    try:
        learner_env, actor_envs = gpu_plan(cfg, visible_gpus())
    except config_lib.ConfigError as e:
        print(f"streamrl: config error: {e}", file=sys.stderr)
        return 2
    if cfg.actors.num == 0:
        print("streamrl: config error: actors.num=0: `streamrl run` needs at least one actor (the learner would wait "
              "for groups nobody sends); start actors elsewhere with `streamrl learner` + `streamrl actor`",
              file=sys.stderr, flush=True)
        return 2
    cfg = with_free_ports(cfg)
    run_dir = cfg.run_path
    if refusal := preflight.existing_run(cfg):
        if not overwrite:
            print(f"streamrl: {refusal}", file=sys.stderr, flush=True)
            return 2
        print(f"streamrl: moved the earlier run aside to {preflight.move_aside(run_dir)}", file=out, flush=True)
        lock.take(run_dir, "--overwrite")  # the lock held on the old directory moved aside with it
    try:
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        cfg_file = run_dir / "config.yaml"
        cfg_file.write_text(config_lib.dump(cfg))
        fingerprint.record(cfg)
    except OSError as e:
        print(f"streamrl: cannot write the run directory {run_dir}: {e.strerror or e}", file=sys.stderr, flush=True)
        return 2
    # A resumed run's metrics.jsonl holds the earlier steps: they are not shown as new progress.
    old_lines = _line_hashes(run_dir / "metrics.jsonl") if cfg.learner.resume else set()
    print(f"streamrl: run {cfg.name!r} -> {run_dir}/  ({cfg.on_policy}, estimator {cfg.advantage.estimator}, "
          f"{cfg.actors.num} actors, {cfg.steps} steps; logs in {run_dir}/logs/)", file=out, flush=True)
    if (m := cfg.monitoring).learner_port:
        actor_ports = (f", actors :{m.actor_port}-{m.actor_port + cfg.actors.num - 1}"
                       if m.actor_port and cfg.actors.num else "")
        print(f"streamrl: Prometheus metrics at http://{m.host}:{m.learner_port}/metrics (learner{actor_ports}); "
              f"dashboard: docker compose -f {_compose_file()} up -d", file=out, flush=True)
    if cfg.transport.curve_keys:
        print(f"streamrl: CurveZMQ encryption and authentication on (keys in {cfg.transport.curve_keys}; the "
              f"learner admits only the actor keys in {cfg.transport.curve_keys}/authorized/)", file=out, flush=True)

    if learner_env or any(actor_envs):
        where = [f"learner {learner_env.get('CUDA_VISIBLE_DEVICES', 'unset')}"] + [
            f"actor-{i} {e.get('CUDA_VISIBLE_DEVICES', 'unset')}" for i, e in enumerate(actor_envs)]
        print(f"streamrl: GPUs (CUDA_VISIBLE_DEVICES): {'; '.join(where)}", file=out, flush=True)

    procs: list[subprocess.Popen] = []
    waits = _Waits(run_dir / "logs" / "learner.log", out)
    interrupts = {"n": 0, "signal": None}

    def on_interrupt(signum, frame):
        interrupts["n"] += 1
        interrupts["signal"] = interrupts["signal"] or signum
        print("\nstreamrl: stopping (Ctrl-C again to kill)" if interrupts["n"] == 1 else "\nstreamrl: killing",
              file=out, flush=True)
        if interrupts["n"] == 1:
            waits.stopping()
            if procs:
                procs[0].send_signal(signal.SIGTERM)
        else:
            for p in procs:
                p.kill()

    # Before any child exists: a Ctrl-C during start-up stops the run like one later.
    old = {s: signal.signal(s, on_interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    phases.mark("configured")
    # On CPU the children are forked from this process once it has imported what they all need:
    # those imports are most of their start-up, and 2 cores would otherwise do them three times.
    fork = forked.enabled() and cfg.actors.backend == "hf" and not learner_env and not any(actor_envs)
    if fork:
        forked.preload(cfg)
        phases.mark("imports")
    learner = spawn(["learner", str(cfg_file)], run_dir / "logs" / "learner.log", cfg.learner.ranks, learner_env,
                    fork=fork)
    procs.append(learner)
    if interrupts["n"]:
        learner.send_signal(signal.SIGTERM)
    actors = [spawn(["actor", str(cfg_file), "--index", str(i)], run_dir / "logs" / f"actor-{i}.log",
                    env_extra=actor_envs[i], fork=fork)
              for i in range(cfg.actors.num)]
    procs += actors
    phases.mark("spawned")
    phases.done(run_dir)
    tail, failure, reported = _Tail(run_dir / "metrics.jsonl"), None, set()

    def show_progress() -> None:
        for line in tail.lines():
            if hash(line) in old_lines:
                continue
            waits.progressed()
            rec = json.loads(line)
            if (rec["step"] + 1) % cfg.log_every == 0 or rec["step"] == 0 or rec["step"] + 1 == cfg.steps:
                print(progress_line(rec, cfg.steps, cfg.max_staleness), file=out, flush=True)

    try:
        while learner.poll() is None:
            show_progress()
            if interrupts["n"] == 1 or failure is not None:
                if (limit := waits.stop_overdue(learner.pid)) is not None:  # stopped or hung: one Ctrl-C ends the run
                    print(f"streamrl: the learner did not stop within {limit:.0f}s; killing it", file=out, flush=True)
                    _kill(learner)
                    continue
            else:
                waits.tell(sum(p.poll() is None for p in actors), len(actors))
            for i, p in enumerate(actors):
                if p.poll() not in (None, 0) and i not in reported:
                    reported.add(i)
                    if interrupts["n"] < 2:
                        line = _child_failure(f"actor-{i}", p.returncode, run_dir / "logs" / f"actor-{i}.log")
                        print(f"streamrl: {line}", file=out, flush=True)
            # An actor that exits 0 has had the learner's shutdown notice: only all of them failing is fatal.
            if actors and failure is None and len(reported) == len(actors):
                failure = "every actor failed"
                print(f"streamrl: {failure}; stopping the learner", file=out, flush=True)
                waits.stopping()
                learner.send_signal(signal.SIGTERM)
            time.sleep(0.2)
        show_progress()
        _stop_all(actors, grace_s=10.0)  # they exit on the learner's shutdown notice; this is the backstop
    finally:
        _stop_all([learner, *actors], grace_s=5.0)
        for s, h in old.items():
            signal.signal(s, h)

    summary_path = run_dir / "summary.json"
    s = _read_summary(summary_path)
    if s is None and learner.returncode < 0:  # killed before it could write its own: the record says so
        _write_killed_summary(summary_path, run_dir, _child_failure("learner", learner.returncode,
                                                                    run_dir / "logs" / "learner.log"))
    code, line = outcome(learner.returncode, s, interrupts["signal"], failure, run_dir / "logs" / "learner.log")
    if line is not None:
        print(f"streamrl: {line}", file=out, flush=True)
    if interrupts["n"] >= 2:
        newest = _newest_checkpoint(run_dir)
        print(f"streamrl: killed the learner and actors; the newest complete checkpoint is {newest or 'none'}",
              file=out, flush=True)
    elif s is not None and code != 1:
        print(f"streamrl: {'done' if code == 0 else 'stopped'} in {s['wall_s']:.0f}s: {s['steps']} steps, "
              f"reward {_fmt(s['reward_first_10pct'], '.3f')} (first 10%) -> "
              f"{_fmt(s['reward_last_10pct'], '.3f')} (last 10%); groups used {s['groups_used']}, "
              f"dropped {s['groups_dropped']}, rejected {s['messages_rejected']}; summary: {summary_path}",
              file=out, flush=True)
        if (m := s.get("mgrpo_layer2")) and m["first_correction_step"] is not None:
            print(f"streamrl: layer 2 trained on {m['steps_with_layer2']} of the {m['steps_since']} steps from the "
                  f"first verified correction (step {m['first_correction_step']}) on, {m['layer2_groups']} groups",
                  file=out, flush=True)
    return code


STOP_GRACE_S = 30.0  # a learner asked to stop that is not running at all (SIGSTOP, traced) is killed after this
STOP_LIMIT_S = 300.0  # any learner asked to stop is killed after this (a big model's final checkpoint fits in it)
WAIT_NOTE_S = 15.0  # with no new step for this long, the supervisor says what the run is waiting for


class _Waits:
    """What `streamrl run` says while nothing visible happens: what the run waits for, every WAIT_NOTE_S."""

    def __init__(self, learner_log: Path, out):
        self.learner_log, self.out = learner_log, out
        self.since = self.last_note = time.monotonic()
        self.stop_asked: float | None = None
        self.steps = 0

    def progressed(self) -> None:
        self.since = self.last_note = time.monotonic()
        self.steps += 1

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
