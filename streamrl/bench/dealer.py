"""`streamrl bench dealer`: what dealing prompts (task.epochs) costs against drawing them (the sampler before it).

- dealer_calls: the learner's side of one prompt under the dealer (answer a 4-prompt request, keep its group,
  record it trained: `learner.dealing.Dealing`) plus the actor's making the prompt from the dealt row, against
  `task.sample(rng)`, the draw with replacement it replaces; in process, per prompt.
- dealer_run: the tiny model on a dataset task, learner + 2 actors as processes over loopback, the same steps
  with `task.epochs` (dealt) and without (drawn): groups/s trained, the ratio, and what each lost at shutdown.
"""

from __future__ import annotations

import json
import time

ROWS = 256
REWARD = "def said(prompts, completions, answer, **kw):\n" \
         "    return [1.0 if c.split()[:1] == [a] else 0.0 for c, a in zip(completions, answer)]\n"


def _data(folder) -> list[str]:
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rows.jsonl").write_text("".join(json.dumps({"prompt": f"say w{i} now", "answer": f"w{i}"}) + "\n"
                                               for i in range(ROWS)))
    (folder / "said.py").write_text(REWARD)
    return ["task.name=dataset", f"task.data={folder / 'rows.jsonl'}", f"task.reward={folder / 'said.py'}:said",
            "task.reward_levels=[0.0, 1.0]", "advantage.r_min_correct=1.0", "actors.max_new_tokens=2"]


def _calls(folder, short: bool) -> dict:
    import random
    from types import SimpleNamespace as NS

    from streamrl import config as config_lib
    from streamrl.comm import wire
    from streamrl.learner.dealing import Dealing
    from streamrl.tasks import rewards

    epochs = 2 if short else 40
    cfg = config_lib.load(None, [*_data(folder), f"task.epochs={epochs}", f"run_dir={folder}", "name=calls"])
    cfg.run_path.mkdir(parents=True, exist_ok=True)
    task = rewards.build(cfg).task
    n = ROWS * epochs
    rng = random.Random(0)
    t0 = time.perf_counter()
    for _ in range(n):
        task.sample(rng)
    drawn_s = time.perf_counter() - t0
    d = Dealing(cfg, task, step=0)
    t0 = time.perf_counter()
    for step in range(n // 4):
        deal = d.deal(wire.PromptsRequest(actor_id="a", session="s", want=4))
        groups = [NS(session="s", prompt_id=task.prompt(task.train[row]).id, layer=1) for _, row in deal.rows]
        for g in groups:
            d.accept(g)
        d.trained(groups, step, step)
    dealt_s = time.perf_counter() - t0
    d.close()
    return {"bench": "dealer_calls", "prompts": n, "us_per_prompt_drawn": 1e6 * drawn_s / n,
            "us_per_prompt_dealt": 1e6 * dealt_s / n, "ratio_dealt_vs_drawn": dealt_s / drawn_s}


def _run(folder, dealt: bool, steps: int) -> dict:
    import subprocess
    from pathlib import Path

    from streamrl.commands import launch

    name = "dealt" if dealt else "drawn"
    g, w, r = launch.free_ports(3)
    args = [*_data(folder), f"steps={steps}", f"name={name}", f"run_dir={folder}", "learner.batch_groups=16",
            f"transport.group_port={g}", f"transport.weights_port={w}", f"transport.weights_request_port={r}",
            "monitoring.learner_port=0", "monitoring.actor_port=0",
            *([f"task.epochs={steps * 16 // ROWS}"] if dealt else [])]
    logs = Path(folder) / f"{name}-logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs = [launch.spawn(["learner", *args], logs / "learner.log")]
    procs += [launch.spawn(["actor", *args, "--index", str(i)], logs / f"actor-{i}.log") for i in range(2)]
    for p in procs:
        if p.wait(timeout=1800) != 0:
            raise RuntimeError(f"bench dealer: a {name} process exited {p.returncode}; logs in {logs}")
    import ast

    stats = [ast.literal_eval([x for x in (logs / f"actor-{i}.log").read_text().splitlines() if ": done {" in x][-1]
                              .split(": done ", 1)[1]) for i in range(2)]
    recs = [json.loads(x) for x in (Path(folder) / name / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((Path(folder) / name / "summary.json").read_text())
    warm = recs[max(1, len(recs) // 10):]
    return {"steps": len(recs), "groups_per_s": 16 * len(warm) / sum(x["step_s"] for x in warm),
            "actor_deal_wait_fraction": sum(a.get("deal_wait_s", 0) for a in stats) / sum(a["wall_s"] for a in stats),
            "lost_at_shutdown": summary["groups_dropped"].get("lost_at_shutdown", 0)}


def dealer(short: bool = False) -> list[dict]:
    import tempfile

    steps, each = (16, 1) if short else (160, 2)  # whole epochs of 256 rows at 16 groups a step
    runs: dict[bool, list[dict]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        calls = _calls(tmp, short)
        for i in range(each):  # interleaved, so a load that comes and goes on the machine touches both alike
            for dealt in (False, True):
                runs[dealt].append(_run(f"{tmp}/{i}", dealt, steps))
    rate = {k: sum(r["groups_per_s"] for r in v) / len(v) for k, v in runs.items()}
    return [calls, {"bench": "dealer_run", "steps": steps, "runs_each": each, "drawn_groups_per_s": rate[False],
                    "dealt_groups_per_s": rate[True], "ratio_dealt_vs_drawn": rate[True] / rate[False],
                    "dealt_actor_wait_fraction": max(r["actor_deal_wait_fraction"] for r in runs[True]),
                    "drawn_lost_at_shutdown": [r["lost_at_shutdown"] for r in runs[False]],
                    "dealt_lost_at_shutdown": [r["lost_at_shutdown"] for r in runs[True]]}]
