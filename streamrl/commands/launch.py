"""`streamrl run`: one learner and N actors as OS processes on this machine, with live progress.

Here: the run's GPUs and ports, its directory, the banner and how a child is started (`spawn`); the
supervisor that starts, watches and stops them is `streamrl.commands.supervisor`.

The exit status says how the run ended (EXIT_STATUSES, shown by `streamrl run --help`); a failure
is one line naming what failed and the log that holds its traceback.
"""

from __future__ import annotations

import argparse
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
from streamrl.commands.supervisor import Supervisor
from streamrl.config import Config
from streamrl.registry import BACKENDS
from streamrl.run import fingerprint, lifecycle, lock, preflight
from streamrl.run.placement import actor_gpus
from streamrl.tasks import epochs
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
    statuses = "\n".join(f"  {code:>3}  {what}" for code, what in EXIT_STATUSES)
    p = subparsers.add_parser("run", help="run the learner and the configured actors on this machine",
                              formatter_class=argparse.RawDescriptionHelpFormatter, epilog="exit status:\n" + statuses)
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

    The learner's ranks take the first `learner.ranks` GPUs; the actors share out the rest, each on
    `actors.tensor_parallel_size` GPUs of its own where its backend shards (ActorConfig.engine_gpus;
    streamrl.run.placement.actor_gpus: actor i takes slot i mod the number of slots, so more actors
    than slots share). With too few GPUs left for one actor, the actors use all GPUs alongside the
    learner (one GPU: everything on it). No GPUs, or CPU actors: nothing is set."""
    if not gpus:
        return {}, [{} for _ in range(cfg.actors.num)]
    ranks = cfg.learner.ranks
    if ranks > len(gpus):  # each rank takes cuda:LOCAL_RANK, and NCCL refuses two ranks on one GPU
        raise config_lib.ConfigError(f"learner.ranks={ranks}: each learner rank needs a GPU of its own, this machine "
                                     f"has {len(gpus)} (allowed: 1..{len(gpus)})")
    learner = {"CUDA_VISIBLE_DEVICES": ",".join(gpus[:ranks])}
    if cfg.actors.on_cpu():
        return learner, [{} for _ in range(cfg.actors.num)]
    tp = cfg.actors.engine_gpus()  # 1 for a backend that generates on one GPU (hf)
    pool = gpus[ranks:] if len(gpus) - ranks >= tp else gpus
    if tp > len(pool):
        raise config_lib.ConfigError(f"actors.tensor_parallel_size={tp}: each actor needs {tp} GPUs, "
                                     f"this machine has {len(gpus)}")
    usable = len(pool) // tp * tp
    actors = [{"CUDA_VISIBLE_DEVICES": ",".join(pool[g] for g in actor_gpus(i, tp, usable))}
              for i in range(cfg.actors.num)]
    if BACKENDS.can(cfg.actors.backend, "engine_memory"):
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
        frac = cfg.actors.engine_memory_fraction()
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


def run(cfg: Config, out=sys.stdout, overwrite: bool = False) -> int:
    phases = Phases("run")  # from this process's start (or STREAMRL_SPAWNED_AT: a bench timing the command)
    try:
        learner_env, actor_envs = gpu_plan(cfg, visible_gpus())
    except config_lib.ConfigError as e:
        lock.give_back(cfg.run_path)  # a refused run leaves no empty directory behind
        print(f"streamrl: config error: {e}", file=sys.stderr)
        return 2
    if cfg.actors.num == 0:
        lock.give_back(cfg.run_path)
        print("streamrl: config error: actors.num=0: `streamrl run` needs at least one actor (the learner would wait "
              "for groups nobody sends); start actors elsewhere with `streamrl learner` + `streamrl actor`",
              file=sys.stderr, flush=True)
        return 2
    cfg = with_free_ports(cfg)
    if signum := lifecycle.stop_asked():  # Ctrl-C before anything started: only the run's lock was taken
        lock.give_back(cfg.run_path)
        print("streamrl: stopped before the run started (nothing was written)", file=out, flush=True)
        return 128 + signum
    if cfg.task.epochs and (rows := epochs.rows_of(cfg)):  # the steps follow from the data, shown and saved
        cfg = epochs.plan(cfg, rows)
        print(f"streamrl: {epochs.describe(cfg, rows)}", file=out, flush=True)
    if (cfg_file := _claim_run_dir(cfg, out, overwrite)) is None:
        return 2
    # spawn is handed over rather than imported there: launch imports the supervisor, and this module's spawn is
    # the one a caller may replace (tests start fake children through it).
    supervisor = Supervisor(cfg, cfg_file, learner_env, actor_envs, spawn, out)
    banner(cfg, learner_env, actor_envs, out)
    supervisor.start(phases)
    try:
        supervisor.watch()
    finally:
        supervisor.stop()
    return supervisor.report()


def _claim_run_dir(cfg: Config, out, overwrite: bool) -> Path | None:
    """The run directory made (an earlier run moved aside with `overwrite`, else refused), with the run's
    config.yaml (the file the children read) and fingerprint; None once a refusal is printed."""
    run_dir = cfg.run_path
    if refusal := preflight.existing_run(cfg):
        if not overwrite:
            print(f"streamrl: {refusal}", file=sys.stderr, flush=True)
            return None
        print(f"streamrl: moved the earlier run aside to {preflight.move_aside(run_dir)}", file=out, flush=True)
        lock.take(run_dir, "--overwrite")  # the lock held on the old directory moved aside with it
    try:
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        cfg_file = run_dir / "config.yaml"
        cfg_file.write_text(config_lib.dump(cfg))
        fingerprint.record(cfg)
    except OSError as e:
        print(f"streamrl: cannot write the run directory {run_dir}: {e.strerror or e}", file=sys.stderr, flush=True)
        return None
    return cfg_file


def banner(cfg: Config, learner_env: dict[str, str], actor_envs: list[dict[str, str]], out) -> None:
    """What `streamrl run` is about to start: the run and its directory, then metrics, encryption and GPUs where set."""
    run_dir = cfg.run_path
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
