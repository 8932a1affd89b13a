"""A verifiers v1 taskset, unchanged, through the whole loop (docs/guides/verifiers.md#verifiers-04-the-v1-stack):
examples/verifiers-v1-copy's `copy_v1` package (a `vf.Taskset` of `vf.Task`s with a `@vf.reward`, and its own
in-process `vf.Harness`); each episode is verifiers' `env.run_episode` through its interception server to the
actors' OpenAI-compatible endpoints, streamed to the DeepSpeed learner. Needs verifiers 0.4 (.ci/run's .venv-vf04
step runs it); skipped beside verifiers 0.3.x. The learning run (chance towards >= 0.6) is `long`."""

from __future__ import annotations

import json

import pytest
from procs import FREE_PORTS, REPO, metrics, streamrl, summary

pytestmark = pytest.mark.slow
verifiers = pytest.importorskip("verifiers")
if hasattr(verifiers, "Environment"):
    pytest.skip(f"verifiers {verifiers.__version__} is the classic API (test_verifiers_run.py); v1 tasksets need "
                "verifiers 0.4", allow_module_level=True)
EXAMPLE = REPO / "examples" / "verifiers-v1-copy"
QUIET = [*FREE_PORTS, "monitoring.learner_port=0", "monitoring.actor_port=0"]


def _args(tmp_path, *more: str) -> list[str]:
    return [str(EXAMPLE / "config.yaml"), f"task.verifiers_env={EXAMPLE / 'copy_v1'}",
            f"run_dir={tmp_path / 'runs'}", *QUIET, *more]


def test_a_v1_taskset_trains_through_the_loop_on_its_rewards_levels(tmp_path):
    streamrl("run", *_args(tmp_path, "steps=4", "endpoint.record_turns=true"), cwd=tmp_path, timeout=300)
    run = tmp_path / "runs" / "verifiers-v1-copy"
    s = summary(run)
    assert s["status"] == "finished" and s["groups_used"] == 4 * 16, s
    assert not s.get("reward_failures"), s
    for r in metrics(run):  # 128 samples a step, each reward a level k/4: their sum is a multiple of 1/4
        total = r["reward_mean"] * 16 * 8
        assert 0.0 <= r["reward_mean"] <= 1.0 and abs(total * 4 - round(total * 4)) < 1e-6, r["reward_mean"]
    turns = [json.loads(x) for i in range(2)
             for x in (run / "agent_turns" / f"actor-{i}.jsonl").read_text().splitlines()]
    episodes = {t["episode"] for t in turns}
    assert episodes and len(turns) == len(episodes)  # the harness's one reply per episode
    assert all(1 <= len(t["completion_ids"]) <= 4 for t in turns)  # actors.max_new_tokens


@pytest.mark.long
@pytest.mark.timeout(900)
def test_the_v1_copy_taskset_learns_from_chance_towards_0_6(tmp_path):
    streamrl("run", *_args(tmp_path, "steps=180"), cwd=tmp_path, timeout=840)
    records = metrics(tmp_path / "runs" / "verifiers-v1-copy")
    first, last = records[:len(records) // 10], records[-(len(records) // 10):]
    start = sum(r["reward_mean"] for r in first) / len(first)
    end = sum(r["reward_mean"] for r in last) / len(last)
    print(f"verifiers v1 copy: reward {start:.3f} (first 10%) -> {end:.3f} (last 10%)")
    assert start < 0.25 and end >= 0.6, (start, end)
