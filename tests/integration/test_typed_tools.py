"""A tool typed `add(a: int, b: int)` gets ints from the tiny model's words (`task.tool_parser: words`), through the
whole loop: the reply `add 1 2` calls add(1, 2), never add("1", "2") (issue 37: it returned "12")."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from procs import FREE_PORTS, REPO, metrics, streamrl, summary

pytestmark = pytest.mark.slow
QUIET = [*FREE_PORTS, "monitoring.learner_port=0", "monitoring.actor_port=0"]

ENV = '''
import os


class AddEnv:
    def __init__(self, row):
        self.want = row["sum"]
        self.tools = [self.add]

    def add(self, a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: The first.
            b: The second.
        """
        with open(os.environ["ADD_LOG"], "a") as f:
            f.write(f"{type(a).__name__} {type(b).__name__} {a + b!r}\\n")
        return a + b

    def reset(self):
        return [{"role": "user", "content": "add 1 2"}]

    def step(self, reply):
        return [], 1.0 if reply.split()[:1] == [str(self.want)] else 0.0, True
'''


def test_a_typed_tool_receives_ints_from_the_words_parser(tmp_path, monkeypatch):
    (tmp_path / "add_env.py").write_text(ENV)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"prompt": "add 1 2", "sum": 3}) + "\n" for _ in range(4)))
    log = tmp_path / "add.log"
    monkeypatch.setenv("ADD_LOG", str(log))
    streamrl("run", str(REPO / "configs" / "tiny.yaml"), "name=typed", "steps=4", "task.name=dataset",
             "task.data=rows.jsonl", "task.environment=add_env.py:AddEnv", "task.tool_parser=words",
             "task.max_turns=2", "task.reward_levels=[0, 1]", "advantage.r_min_correct=1",
             "task.vocabulary=[add, '1', '2', '3', x]", "actors.max_new_tokens=3", "actors.group_size=8",
             "actors.prompts_per_generate=8", "learner.batch_groups=8", "log.samples_every=1",
             "log.samples_per_log=64",
             f"run_dir={tmp_path / 'runs'}", *QUIET,
             cwd=tmp_path, timeout=400)
    s = summary(tmp_path / "runs" / "typed")
    assert s["status"] == "finished"
    calls = Counter(line.rsplit(" ", 1)[0] for line in log.read_text().splitlines())
    assert calls and set(calls) == {"int int"}, calls  # `add x 1` is a bad_call the model sees, never a str
    # the actors' tool counts reach summary.json, not only Prometheus: every call that ran, and none beyond
    episodes = s["episodes"]
    assert episodes["episodes"] > 0 and episodes["tool_calls/add/ok"] == sum(calls.values()), (episodes, calls)
    # ... and metrics.jsonl, as the groups carry them (never beyond the total); the final line's totals match
    seen = [r["episode_counts"] for r in metrics(tmp_path / "runs" / "typed")]
    assert seen[-1].get("episodes", 0) > 0, seen
    assert all(a.get("episodes", 0) <= b.get("episodes", 0) <= episodes["episodes"] for a, b in zip(seen, seen[1:]))
    # the samples log (every trained sample: 64 a step) holds each episode's turns and tool calls
    logged = [json.loads(line) for line in (tmp_path / "runs" / "typed" / "samples.jsonl").read_text().splitlines()]
    assert logged and all(1 <= r["turns"] <= 2 and isinstance(r["tool_calls"], dict) for r in logged), logged[:2]
    assert any(r["tool_calls"].get("add/ok") for r in logged), logged[:4]
    for r in logged:  # ... and its turns in order, each with its role and text: the model's first, then the tool's
        roles = [t["role"] for t in r["conversation"]]
        assert roles[0] == "model" and roles.count("model") == r["turns"] and set(roles) <= {"model", "tool"}, r
        assert " ".join(t["text"] for t in r["conversation"]).split() == r["completion"].split(), r
    assert any(t.get("tools") == ["add"] for r in logged for t in r["conversation"]), logged[:4]
