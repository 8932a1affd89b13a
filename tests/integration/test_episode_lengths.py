"""Pacing keeps the trained episodes' lengths as generated (issue 46): on a multi-turn task whose episodes take 1 to
6 model turns, throttled actors make no group that is thrown away, so a long episode (a slower generate call) is no
likelier to be dropped than a short one, and the lengths trained match the lengths generated."""

from __future__ import annotations

import json

import pytest
from procs import FREE_PORTS, REPO, streamrl, summary

pytestmark = pytest.mark.slow
QUIET = [*FREE_PORTS, "monitoring.learner_port=0", "monitoring.actor_port=0"]

ENV = '''
class Laps:
    """An episode of row["laps"] model turns: each reply but the last is answered "again"; the last is scored."""

    def __init__(self, row):
        self.laps, self.turns = int(row["laps"]), 0

    def reset(self):
        return [{"role": "user", "content": "say a"}]

    def step(self, reply):
        self.turns += 1
        if self.turns < self.laps:
            return [{"role": "user", "content": "again"}], None, False
        return [], float(reply.strip().startswith("a")), True
'''


def histogram(counts: dict[int, int]) -> dict[int, float]:
    total = sum(counts.values())
    return {k: round(v / total, 3) for k, v in sorted(counts.items())}


@pytest.mark.long
def test_trained_episodes_have_the_lengths_generated_when_episodes_take_one_to_six_turns(tmp_path):
    (tmp_path / "laps_env.py").write_text(ENV)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"prompt": "say a", "answer": "a", "laps": 1 + i % 6})
                                                 + "\n" for i in range(60)))
    steps = 20
    streamrl("run", str(REPO / "configs" / "tiny.yaml"), "name=laps", f"steps={steps}", "task.name=dataset",
             "task.data=rows.jsonl", "task.environment=laps_env.py:Laps", "task.max_turns=6",
             "task.reward_levels=[0, 1]", "advantage.r_min_correct=1", "task.vocabulary=[a, b]",
             "actors.max_new_tokens=3", "actors.prompts_per_generate=2", "log.samples_every=1",
             "log.samples_per_log=128", f"run_dir={tmp_path / 'runs'}", *QUIET, cwd=tmp_path, timeout=600)
    run = tmp_path / "runs" / "laps"
    s = summary(run)
    assert s["status"] == "finished" and "stale" not in s["groups_dropped"], s["groups_dropped"]
    generated = {int(k.split("/")[1]): v for k, v in s["episodes"].items() if k.startswith("turns/")}
    trained: dict[int, int] = {}
    for line in (run / "samples.jsonl").read_text().splitlines():
        turns = json.loads(line)["turns"]
        trained[turns] = trained.get(turns, 0) + 1
    assert sum(trained.values()) == steps * 16 * 8 and set(generated) == set(range(1, 7)), (generated, trained)
    g, t = histogram(generated), histogram(trained)
    print(f"episodes by turns, generated {generated} {g}, trained {trained} {t}")
    # Every episode trained was generated, so only those not trained (lost at shutdown, dropped) can tell the two
    # apart; a drop path that starved slow episodes would show in the 5- and 6-turn ones first.
    assert sum(abs(g[k] - t.get(k, 0.0)) for k in g) / 2 < 0.05, (g, t)
    assert t[6] >= 0.9 * g[6] and t[5] >= 0.9 * g[5], (g, t)
