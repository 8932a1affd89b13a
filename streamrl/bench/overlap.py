"""`streamrl bench overlap`: the tiny job strict and async, against the ideal overlap bound."""

from __future__ import annotations


def _job(mode: str, steps: int, workdir, pin: bool) -> dict:
    """One tiny-default run (learner + 2 actors as separate processes, learner pinned to CPU 0 and the
    actors to the others when pin), returning its step records after warm-up and the actors' stats."""
    import ast
    import json
    import os
    import subprocess
    from pathlib import Path

    from streamrl.commands import launch

    g, w, r = launch.free_ports(3)
    args = [f"steps={steps}", f"on_policy={mode}", f"name={mode}", f"run_dir={workdir}",
            f"transport.group_port={g}", f"transport.weights_port={w}", f"transport.weights_request_port={r}",
            "monitoring.learner_port=0", "monitoring.actor_port=0"]
    logs = Path(workdir) / f"{mode}-logs"
    logs.mkdir(parents=True, exist_ok=True)

    def spawn(role: list[str], name: str) -> subprocess.Popen:
        return launch.spawn([*role, *args], logs / f"{name}.log")

    learner = spawn(["learner"], "learner")
    actors = [spawn(["actor", "--index", str(i)], f"actor-{i}") for i in range(2)]
    cpus = sorted(os.sched_getaffinity(0))
    if pin and len(cpus) >= 2:
        os.sched_setaffinity(learner.pid, {cpus[0]})
        for a in actors:
            os.sched_setaffinity(a.pid, set(cpus[1:]))
    for p in (learner, *actors):
        p.wait(timeout=1800)
    recs = [json.loads(x) for x in (Path(workdir) / mode / "metrics.jsonl").read_text().splitlines()]
    stats = []
    for i in range(2):
        line = [x for x in (logs / f"actor-{i}.log").read_text().splitlines() if ": done {" in x][-1]
        stats.append(ast.literal_eval(line.split(": done ", 1)[1]))
    return {"recs": recs[max(1, steps // 10):], "actors": stats}


def overlap(short: bool = False) -> list[dict]:
    """The same tiny job strict and async: the async speed-up against the ideal bound
    (t_gen + t_train) / max(t_gen, t_train) taken from the strict run's own timings; the learner's
    overhead outside forward/backward/optimizer and the actors' idle share in the async run."""
    import tempfile

    steps = 20 if short else 300
    with tempfile.TemporaryDirectory() as tmp:
        strict = _job("strict", steps, tmp, pin=True)
        fast = _job("async", steps, tmp, pin=True)
    s, a = strict["recs"], fast["recs"]
    t_gen = sum(r["wait_s"] for r in s)  # strict: the learner waits exactly while actors generate
    t_train = sum(r["step_s"] - r["wait_s"] for r in s)
    bound = (t_gen + t_train) / max(t_gen, t_train)
    speedup = sum(r["step_s"] for r in s) / sum(r["step_s"] for r in a)
    a_step = sum(r["step_s"] + r.get("metrics_s", 0) for r in a)
    overhead = sum(r["batch_s"] + r["publish_s"] + r.get("metrics_s", 0) for r in a) / a_step
    idle = sum(x["weights_wait_s"] for x in fast["actors"]) / sum(x["wall_s"] for x in fast["actors"])
    return [{"bench": "overlap", "steps": len(a), "strict_ms_per_step": 1e3 * sum(r["step_s"] for r in s) / len(s),
             "async_ms_per_step": 1e3 * sum(r["step_s"] for r in a) / len(a), "async_speedup": speedup,
             "ideal_bound": bound, "ratio_vs_ideal": speedup / bound,
             "learner_overhead_fraction": overhead,
             **{f"learner_{k}_fraction": sum(r.get(f"{k}_s", 0) for r in a) / a_step
                for k in ("batch", "publish", "metrics")},
             "learner_waiting_fraction": sum(r["wait_s"] for r in a) / a_step,
             "actor_idle_fraction": idle}]

