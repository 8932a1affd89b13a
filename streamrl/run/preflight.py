"""Everything that can be checked before a process starts, each problem one line.

`streamrl check`, `streamrl run` and each `streamrl learner` / `streamrl actor` call `problems()`
first, so a wrong run_dir, a taken port or a missing key folder is reported at once, not as a
traceback after a minute of start-up. Add new checks here (one function each, listed in
`problems`), so every command gets them.

A run name that already holds results is refused (`existing_run`): its options are a new name,
`learner.resume=true`, or `--overwrite`, which moves the old run aside (`move_aside`), never deletes it.
"""

from __future__ import annotations

import errno
import os
import socket
import tempfile
import time
from pathlib import Path

from streamrl.config import Config
from streamrl.models import context
from streamrl.telemetry import trackers

ROLES = ("check", "run", "learner", "actor")


def problems(cfg: Config, role: str, index: int = 0) -> tuple[list[str], list[str]]:
    """(errors, warnings) for `role` (check and run: this machine runs everything; learner; actor `index`)."""
    assert role in ROLES, role
    errors: list[str] = []
    warnings: list[str] = []
    learner_here = role != "actor"
    rank0 = os.environ.get("RANK", "0") == "0"  # under torchrun only rank 0 binds sockets and writes the run
    if learner_here:
        errors += run_dir_problems(cfg)
    if learner_here and rank0:
        errors += port_problems(cfg)
        errors += trackers.problems(cfg.monitoring.report_to)  # the leading learner rank is the one that reports
        warnings += trackers.start_warnings(cfg.monitoring.report_to)
    warnings += metrics_port_warnings(cfg, role, index) if rank0 or role == "actor" else []
    errors += key_problems(cfg, role, index)
    errors += context.problems(cfg)  # a completion cap the model's positions cannot hold, in every process
    return errors, warnings


def run_dir_problems(cfg: Config) -> list[str]:
    """The run directory must be a directory this process can create and write."""
    path = cfg.run_path
    where = f"run_dir={cfg.run_dir}, name={cfg.name}"
    p = path
    while not p.exists():
        if p == p.parent:
            break
        p = p.parent
    if not p.is_dir():
        return [f"{where}: cannot create {path}: {p} is a file, not a folder; set run_dir to a folder"]
    try:  # the only sure test (root, read-only mounts, /proc): make a file there and remove it
        fd, probe = tempfile.mkstemp(prefix=".streamrl-check-", dir=p)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return [f"{where}: cannot write {path}: {p}: {e.strerror or e}; set run_dir to a folder you can write"]
    return []


def port_problems(cfg: Config) -> list[str]:
    """The learner's ports (0: any free one) must be free on transport.host, and distinct."""
    t = cfg.transport
    names = ["group_port", "weights_port", "weights_request_port"]
    if t.weight_sync == "collective":
        names.append("weight_sync_port")
    ports = {n: getattr(t, n) for n in names if getattr(t, n)}
    out = []
    seen: dict[int, str] = {}
    for name, port in ports.items():
        if port in seen:
            out.append(f"transport.{name}={port}: the same as transport.{seen[port]}; give each port its own number")
            continue
        seen[port] = name
        if problem := _bind_problem(t.host, port):
            out.append(f"transport.{name}={port}: {problem} on {t.host}; choose a free port, or 0 for any free one")
    return out


def metrics_port_warnings(cfg: Config, role: str, index: int) -> list[str]:
    """A taken /metrics port only costs the metrics (the process runs without them): a warning."""
    m = cfg.monitoring
    ports = []
    if role != "actor" and m.learner_port:
        ports.append(("monitoring.learner_port", m.learner_port))
    if m.actor_port:
        indices = range(cfg.actors.num) if role in ("check", "run") else [index] if role == "actor" else []
        ports += [(f"monitoring.actor_port (actor-{i})", m.actor_port + i) for i in indices]
    return [f"{name}={port}: {problem} on {m.host}; that process will run without /metrics"
            for name, port in ports if (problem := _bind_problem(m.host, port))]


def _bind_problem(host: str, port: int) -> str | None:
    with socket.socket() as s:
        # As ZeroMQ and http.server do: a port held only by closing connections (TIME_WAIT) is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except socket.gaierror:
            return "the host name does not resolve"
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return "already in use by another process"
            if e.errno == errno.EADDRNOTAVAIL:
                return "not an address of this machine"
            if e.errno == errno.EACCES:
                return "needs privileges to bind (ports below 1024)"
            return e.strerror or str(e)
    return None


def key_problems(cfg: Config, role: str, index: int) -> list[str]:
    """transport.curve_keys must hold the files this role uses (made by `streamrl keys`)."""
    d = cfg.transport.curve_keys
    if not d:
        return []
    folder = Path(d)
    if not folder.is_dir():
        return [f"transport.curve_keys={d}: no such folder; make keys with `streamrl keys {d} --actors "
                f"{max(cfg.actors.num, 1)}`"]
    needed = []
    if role != "actor":
        needed += ["learner.key_secret", "authorized"]
    actors = range(cfg.actors.num) if role in ("check", "run") else [index] if role == "actor" else []
    needed += [f"actor-{i}.key_secret" for i in actors]
    if role == "actor":
        needed.append("learner.key")
    missing = [n for n in needed if not (folder / n).exists()]
    if missing:
        return [f"transport.curve_keys={d}: missing {', '.join(missing)}; make keys with "
                f"`streamrl keys {d} --actors {max(cfg.actors.num, index + 1)} --force`"]
    return []


def results_in(run_path: Path) -> list[str]:
    """What a run directory holds that a new run would overwrite: metrics, summary, checkpoints."""
    found = []
    metrics = run_path / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size:
        found.append("metrics.jsonl")
    if (run_path / "summary.json").is_file():
        found.append("summary.json")
    ckpt = run_path / "checkpoints"
    if ckpt.is_dir() and (tags := [p for p in ckpt.iterdir() if p.is_dir()]):
        found.append(f"{len(tags)} checkpoint{'s' if len(tags) > 1 else ''}")
    return found


def existing_run(cfg: Config) -> str | None:
    """One line refusing a fresh run over a run directory that holds results, or a resume of one that has no complete
    checkpoint (it would restart at step 0 over the run's records); None when it is free."""
    found = results_in(cfg.run_path)
    if cfg.learner.resume:
        if not found or complete_checkpoint(cfg.run_path):
            return None
        return (f"learner.resume=true: {cfg.run_path} holds a run ({', '.join(found)}) but no complete checkpoint to "
                f"resume from (set learner.checkpoint_every to save them during a run); pass --overwrite to move it "
                f"aside to {cfg.run_path}.old-<time> and start afresh, or choose a new name (name=...)")
    if not found:
        return None
    return (f"{cfg.run_path} already holds a run ({', '.join(found)}); choose a new name (name=...), continue it "
            f"(learner.resume=true), or pass --overwrite to move it aside to {cfg.run_path}.old-<time>")


def complete_checkpoint(run_path: Path) -> bool:
    """Whether the run has a checkpoint a resume can start from (its streamrl.json written)."""
    from streamrl.run.checkpoints import complete_newest_first

    return bool(complete_newest_first(run_path / "checkpoints"))


def move_aside(run_path: Path) -> Path:
    """Rename a run directory to `<run>.old-<YYYYmmdd-HHMMSS>` (never deleting anything); the new name."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = run_path.with_name(f"{run_path.name}.old-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = run_path.with_name(f"{run_path.name}.old-{stamp}-{n}")
    run_path.rename(target)
    return target
