"""`streamrl bench startup`: from typing `streamrl run` to the first learner step of the default job.

Each run is the real command (`python -m streamrl run`, 2 steps, free ports), timed from the moment
this bench starts it (STREAMRL_SPAWNED_AT: the launcher's clock starts there, interpreter start-up
included). The phases come from the start-up records every run writes (RUN_DIR/logs/startup-*.json,
`streamrl.telemetry.startup`), so the figure is what users get:

  launch       interpreter start, config loaded and checked (the launcher)
  preload      torch, the tokenizer's and the model's modules imported once in the launcher, children
               forked from it (CPU runs)
  imports      the learner's own imports after it started
  model        the learner's model and tokenizer
  engine       DeepSpeed: import, process group, optimizer
  ready        sockets bound and version 0 published
  first_group  until the learner holds its first batch of groups (actors: weights, generate, send)
  first_step   the first optimizer step
  total        launch start -> first step done
  critical_cpu CPU seconds on that path (launcher until it forks, then the learner): the time it
               takes when each process has a core, which a loaded machine's total hides
  all_cpu      CPU seconds of all processes until their start-up was done

Reported as the median over the runs with min and max, against references measured in the same
sitting, interleaved: the same command with every child a fresh interpreter (STREAMRL_FORK=0, as
before the launcher forked); a bare `python -c "import torch, deepspeed, tokenizers"` (the learner's
own imports for the tiny job: what the process that takes the first step pays before its first line of
work, whatever the launcher does); and a bare `python -c "import torch; from
transformers import LlamaForCausalLM"` (what a process training transformers' Llama pays, e.g. TRL, or
streamrl before its tiny model stopped importing transformers' modeling code; the full bench only).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PHASES = ["launch", "preload", "imports", "model", "engine", "ready", "first_group", "first_step"]
BARE_IMPORTS = "import torch, deepspeed, tokenizers"
TRANSFORMERS_IMPORTS = "import torch; from transformers import LlamaForCausalLM"


def phases(records: dict[str, dict]) -> dict[str, float]:
    """The critical path to the first step from one run's start-up records (streamrl.telemetry.startup.read)."""
    run, learner = records["run"]["marks"], records["learner"]["marks"]
    out = {"launch": run["configured"] - run["start"],
           "preload": run.get("imports", run["configured"]) - run["configured"],
           # from the launcher's last mark to the learner's first: forking (or exec'ing) the children
           "imports": learner["imports"] - run.get("imports", run["configured"])}
    prev = "imports"
    for name in ("model", "engine", "ready", "first_group", "first_step"):
        out[name] = learner[name] - learner[prev]
        prev = name
    out["total"] = learner["first_step"] - run["start"]
    # CPU seconds on that path (the launcher's, then the learner's own): what it takes with a core
    # to itself, which a loaded machine hides; and all processes' CPU up to the first step.
    cpu = {who: rec.get("cpu", {}) for who, rec in records.items()}
    if cpu["run"] and cpu["learner"]:
        out["critical_cpu"] = cpu["run"].get("imports", cpu["run"]["configured"]) + cpu["learner"]["first_step"]
        out["all_cpu"] = cpu["run"]["spawned"] + sum(max(c.values()) for who, c in cpu.items() if who != "run")
    return out


def _one(workdir: Path, name: str, fork: bool) -> dict[str, float]:
    from streamrl.commands import forked, launch
    from streamrl.telemetry import startup

    g, w, r = launch.free_ports(3)
    # `streamrl bench` may have run the learner bench in this process first, which set MASTER_PORT and still
    # holds that port: a child learner inheriting it could not bind its rendezvous (EADDRINUSE).
    rendezvous = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in rendezvous}
    env.update({forked.ENV: "1" if fork else "0", startup.SPAWNED_AT: repr(time.time())})
    proc = subprocess.run(
        [sys.executable, "-m", "streamrl", "run", "steps=2", f"name={name}", f"run_dir={workdir}",
         f"transport.group_port={g}", f"transport.weights_port={w}", f"transport.weights_request_port={r}",
         "monitoring.learner_port=0", "monitoring.actor_port=0", "learner.checkpoint_every=0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"streamrl run failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
    return phases(startup.read(workdir / name))


def _bare_imports(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, timeout=600, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)  # DeepSpeed's import prints an accelerator warning
    return time.perf_counter() - t0


def _spread(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def startup(short: bool = False) -> list[dict]:
    runs = 1 if short else 5
    load = os.getloadavg()[0]
    got: dict[str, list[dict]] = {"fork": [], "exec": []}
    bare: list[float] = []
    hf: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):  # interleaved, so a change in the machine's load falls on all alike
            got["fork"].append(_one(Path(tmp), f"fork-{i}", fork=True))
            if not short:
                got["exec"].append(_one(Path(tmp), f"exec-{i}", fork=False))
            bare.append(_bare_imports(BARE_IMPORTS))
            if not short:  # a second reference import would double what the short pass (CI's) spends on them
                hf.append(_bare_imports(TRANSFORMERS_IMPORTS))
    rows = []
    bare_s = statistics.median(bare)
    for mode, results in got.items():
        if not results:
            continue
        total, lo, hi = _spread([r["total"] for r in results])
        row = {"bench": "startup", "mode": mode, "runs": len(results), "load_avg_1m": load,
               **{f"{p}_s": statistics.median(r[p] for r in results) for p in PHASES},
               "total_s": total, "total_min_s": lo, "total_max_s": hi,
               **{f"{k}_s": statistics.median(r[k] for r in results) for k in ("critical_cpu", "all_cpu")
                  if all(k in r for r in results)},
               "bare_imports_s": bare_s,
               "ratio_vs_bare_imports": total / bare_s}
        if hf:
            row.update(transformers_imports_s=statistics.median(hf),
                       ratio_vs_transformers_imports=total / statistics.median(hf))
        if mode == "fork" and got["exec"]:
            row["ratio_vs_exec"] = total / statistics.median(r["total"] for r in got["exec"])
        rows.append(row)
    return rows
