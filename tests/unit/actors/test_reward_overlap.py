"""Scoring overlaps generation (task.reward_overlap): a generate call's groups are scored on the reward pool
while the next call generates, never across a weight update, and the call in flight at the end is scored."""

from __future__ import annotations

import json
import sys
import threading

from streamrl import config as config_lib
from streamrl.actors.backends import Completion
from streamrl.actors.generation import Generation
from streamrl.models.word_tokenizer import WordTokenizer
from streamrl.tasks import rewards
from streamrl.telemetry import actor_metrics, prometheus_metrics

REWARD = '''
import threading
STARTED = threading.Event()
RELEASE = threading.Event()

def gated(prompts, completions, answer, **kwargs):
    STARTED.set()
    RELEASE.wait(10)
    return [1.0 if (c[0]["content"] if isinstance(c, list) else c) == a else 0.0 for c, a in zip(completions, answer)]
'''


class Echo:
    """A backend that writes each row's answer (the last word of its prompt), and records its calls."""

    def __init__(self, tok):
        self.tok, self.calls = tok, 0

    def generate(self, prompts, n):
        self.calls += 1
        return [[Completion([p[-1]], [-0.1], "stop") for _ in range(n)] for p in prompts]


def setup(tmp_path, *overrides):
    rows = [{"prompt": [{"role": "system", "content": "Say the last word."}, {"role": "user", "content": f"x {w}"}],
             "answer": w} for w in ("red", "blue")]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "gate.py").write_text(REWARD)
    cfg = config_lib.load(None, ["task.name=dataset", f"task.data={tmp_path / 'rows.jsonl'}",
                                 f"task.reward={tmp_path / 'gate.py'}:gated", "task.reward_levels=[0, 1]",
                                 "advantage.r_min_correct=1", "actors.group_size=2", "actors.prompts_per_generate=2",
                                 *overrides])
    reward = rewards.build(cfg)
    tok = WordTokenizer(reward.task.vocabulary)
    backend = Echo(tok)
    metrics = actor_metrics.ActorMetrics(prometheus_metrics.new_registry(), "t", "actor-0")
    gate = sys.modules[reward.task.functions.fns[0].__module__]  # the reward file's module: its events
    return Generation(cfg, 0, 0, backend, tok, reward, metrics), backend, gate


def test_the_next_call_generates_while_the_previous_one_is_scored_and_versions_never_mix(tmp_path):
    gen, backend, gate = setup(tmp_path)
    assert gen.overlap
    assert gen(8, 0, None) == []                 # generated, handed to the pool, not waited for
    assert gate.STARTED.wait(5) and backend.calls == 1
    done = []
    second = threading.Thread(target=lambda: done.append(gen(8, 0, None)))
    second.start()
    second.join(0.5)
    assert backend.calls == 2 and second.is_alive()  # the second call generated while the first is still scored
    gate.RELEASE.set()
    second.join(10)
    assert [g.policy_version for g in done[0]] == [0, 0] and all(g.rewards == [1.0, 1.0] for g in done[0])
    across = gen(8, 1, None)                     # new weights: the pending call comes back, nothing new starts
    assert backend.calls == 2 and [g.policy_version for g in across] == [0, 0] and gen.pending is None
    gen(8, 1, None)
    assert gen.pending is not None and gen.report()["groups_unsent_at_stop"] == 2 and gen.pending is None


def test_made_plus_in_flight_stay_within_the_budget_and_strict_runs_do_not_overlap(tmp_path):
    gen, backend, gate = setup(tmp_path)
    gate.RELEASE.set()
    gen(3, 0, None)                              # 2 prompts in flight
    assert len(gen.pending.prompts) == 2
    assert len(gen(3, 0, None)) == 2 and len(gen.pending.prompts) == 1   # room for 1 more only
    strict, _, _ = setup(tmp_path, "on_policy=strict")
    assert not strict.overlap
