"""Multi-turn episodes with a tool through the whole loop (docs/guides/multi-turn.md): two actors play lookup episodes
on the tiny model, call the tool, stream the episodes to the DeepSpeed learner, and train. The learning proof
(chance to ~1.0 with the tool, chance without it) takes a few hundred steps and is measured outside the suite."""

from __future__ import annotations

import ast
import re

import pytest
from procs import FREE_PORTS, REPO, streamrl, summary

pytestmark = pytest.mark.slow
QUIET = [*FREE_PORTS, "monitoring.learner_port=0", "monitoring.actor_port=0"]


def _actor_report(run_dir, i: int) -> dict:
    line = next(x for x in (run_dir / "logs" / f"actor-{i}.log").read_text().splitlines() if ": done {" in x)
    return ast.literal_eval(re.sub(r"^.*?: done ", "", line))


def test_lookup_episodes_call_the_tool_and_train_through_the_loop(tmp_path):
    streamrl("run", str(REPO / "configs" / "tiny-tools.yaml"), "steps=20", f"run_dir={tmp_path / 'runs'}", *QUIET,
             cwd=tmp_path, timeout=400)
    run = tmp_path / "runs" / "tiny-tools"
    s = summary(run)
    assert s["status"] == "finished" and s["groups_used"] == 20 * 16, s
    for i in range(2):
        r = _actor_report(run, i)
        assert r["episodes"] > 0 and r["tool_calls"].get("lookup/ok", 0) > 0, r
        assert 1.0 < r["episode_turns_mean"] <= 2.0 and r["episodes_template_drift"] == 0, r
        assert set(r["tool_calls"]) <= {f"{t}/{o}" for t in ("lookup", "(unknown)")
                                        for o in ("ok", "raised", "timeout", "unknown_tool", "bad_call")}, r
