"""The rubric grader in a run: `task.reward: streamrl.tasks.graders:rubric` reads the run's `grader` section in the
actors' processes, its scores become the rewards the learner trains on, and an endpoint that fails mid-run costs
counted unscored samples, not the run. The endpoint is tests/fakes/openai_server.py (the OpenAI chat-completions API on
loopback, scripted replies, no model); the `vllm`-marked tests/integration/test_grader_vllm.py grades with a real
`vllm serve`."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from fakes.openai_server import ChatServer
from procs import FREE_PORTS, REPO, metrics, reaped, summary

pytestmark = pytest.mark.slow
EXAMPLES = REPO / "examples"


@pytest.mark.long
def test_a_run_trains_on_the_graders_scores_and_survives_the_grader_failing(tmp_path):
    subprocess.run([sys.executable, str(EXAMPLES / "chat-dataset" / "make_data.py"), str(tmp_path)], check=True)
    server = ChatServer(lambda request: "2").start()  # every completion: 2 on a 1..3 rubric, the level 0.5
    run_dir = tmp_path / "runs" / "graded"
    args = [str(EXAMPLES / "chat-dataset" / "config.yaml"), "name=graded", "steps=20", f"run_dir={tmp_path / 'runs'}",
            "task.reward=streamrl.tasks.graders:rubric", "task.reward_levels=[0.0,0.5,1.0]", "grader.scale=3",
            f"grader.base_url={server.base_url}", "grader.retries=0", "grader.timeout_s=2", "grader.constrain=none",
            *FREE_PORTS, "monitoring.learner_port=0", "monitoring.actor_port=0"]
    proc = subprocess.Popen([sys.executable, "-m", "streamrl", "run", *args], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    with reaped(proc):
        deadline = time.monotonic() + 300
        while not ((run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= 5):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
            time.sleep(0.1)
        server.status = 503  # the grader's endpoint fails for a while, then comes back
        failing_since = len(server.requests)
        while len(server.requests) < failing_since + 8:
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            time.sleep(0.05)
        server.status = None
        out = proc.communicate(timeout=600)[0]
    server.stop()
    s = summary(run_dir)
    assert proc.returncode == 0 and s["status"] == "finished", out[-3000:]
    assert s["reward_failures"].get("none", 0) >= 1, s  # the grader's failures: unscored samples, counted
    rewards = [r["reward_mean"] for r in metrics(run_dir)]
    assert rewards[:5] == pytest.approx([0.5] * 5) and rewards[-1] == pytest.approx(0.5), rewards  # its scores
