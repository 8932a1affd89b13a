"""An environment whose step raises on every episode is the user's bug, like a reward that raises on every call: the
run stops within seconds, exit 1, with the environment's name, its error and the first traceback on the terminal
and every count in summary.json (issue 37: the episodes were scored lowest and the run trained on nothing)."""

from __future__ import annotations

import json
import time

import pytest
from procs import FREE_PORTS, REPO, streamrl, summary

pytestmark = pytest.mark.slow
QUIET = [*FREE_PORTS, "monitoring.learner_port=0", "monitoring.actor_port=0"]

ENV = '''
class Broken:
    def __init__(self, row):
        self.row = row

    def reset(self):
        return [{"role": "user", "content": "say a"}]

    def step(self, reply):
        return [], {}["missing"], True  # its own bug (a key its row lacks would be bad data)
'''


def test_an_environment_raising_on_every_step_stops_the_run_within_60s_naming_it(tmp_path):
    (tmp_path / "broken_env.py").write_text(ENV)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"prompt": "say a", "answer": "a"}) + "\n"
                                                 for _ in range(4)))
    t0 = time.monotonic()
    out = streamrl("run", str(REPO / "configs" / "tiny.yaml"), "name=broken-env", "steps=300", "task.name=dataset",
                   "task.data=rows.jsonl", "task.environment=broken_env.py:Broken", "task.max_turns=2",
                   "task.reward_levels=[0, 1]", "advantage.r_min_correct=1", "task.vocabulary=[a, b]",
                   "actors.max_new_tokens=3", f"run_dir={tmp_path / 'runs'}", *QUIET, cwd=tmp_path, timeout=120,
                   check=False)
    took = time.monotonic() - t0
    terminal = out.stdout + out.stderr
    assert out.returncode == 1, (out.returncode, terminal[-3000:])
    assert took < 60, took
    assert "environment broken_env.py:Broken failed on" in terminal and "KeyError: 'missing'" in terminal, \
        terminal[-3000:]
    assert 'broken_env.py", line 10, in step' in terminal, terminal[-3000:]  # the user's own frame
    s = summary(tmp_path / "runs" / "broken-env")
    broken = s["user_code_failure"]
    assert s["status"] == "failed" and broken["kind"] == "environment" and broken["reason"] == "raised", s
    assert broken["counts"]["environment_raised"] >= 50, broken["counts"]  # the window's 50 episodes at least
