"""A verifiers environment, unchanged, through the whole loop (docs/guides/verifiers.md): examples/verifiers-copy's
`vf.SingleTurnEnv` with its `vf.Rubric`, loaded as a module; each rollout is verifiers' own `run_rollout` through
the actors' OpenAI-compatible endpoints, streamed to the DeepSpeed learner. The learning run (chance towards ≥ 0.6
reward) is `long`: `STREAMRL_LONG=1 pytest -q -m long tests/integration/test_verifiers_run.py` (in .ci/run)."""

from __future__ import annotations

import json

import pytest
from procs import FREE_PORTS, REPO, metrics, streamrl, summary

pytestmark = pytest.mark.slow
pytest.importorskip("verifiers.legacy")  # the classic Environment API (verifiers 0.3.x)
EXAMPLE = REPO / "examples" / "verifiers-copy"
QUIET = [*FREE_PORTS, "monitoring.learner_port=0", "monitoring.actor_port=0"]


def _args(tmp_path, *more: str) -> list[str]:
    return [str(EXAMPLE / "config.yaml"), f"task.verifiers_env={EXAMPLE / 'copy_env.py'}",
            f"run_dir={tmp_path / 'runs'}", *QUIET, *more]


def test_a_verifiers_environment_trains_through_the_loop_on_its_rubrics_levels(tmp_path):
    streamrl("run", *_args(tmp_path, "steps=4", "endpoint.record_turns=true"), cwd=tmp_path, timeout=300)
    run = tmp_path / "runs" / "verifiers-copy"
    s = summary(run)
    assert s["status"] == "finished" and s["groups_used"] == 4 * 16, s
    assert not s.get("reward_failures"), s
    for r in metrics(run):  # 128 samples a step, each reward a level k/4: their sum is a multiple of 1/4
        total = r["reward_mean"] * 16 * 8
        assert 0.0 <= r["reward_mean"] <= 1.0 and abs(total * 4 - round(total * 4)) < 1e-6, r["reward_mean"]
    turns = [json.loads(x) for i in range(2)
             for x in (run / "agent_turns" / f"actor-{i}.jsonl").read_text().splitlines()]
    episodes = {t["episode"] for t in turns}
    assert episodes and len(turns) == len(episodes)  # a SingleTurnEnv: max_turns=1, kept
    assert all(1 <= len(t["completion_ids"]) <= 4 for t in turns)  # actors.max_new_tokens
    # the samples log (step 0's) shows each rollout as its turns: a SingleTurnEnv's one, the model's
    logged = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert logged and all(r["turns"] == 1 and r["tool_calls"] == {} and [t["role"] for t in r["conversation"]]
                          == ["model"] and r["conversation"][0]["text"] == r["completion"] for r in logged), logged[:2]


@pytest.mark.long
@pytest.mark.timeout(900)
def test_the_verifiers_copy_environment_learns_from_chance_towards_0_6(tmp_path):
    streamrl("run", *_args(tmp_path, "steps=250"), cwd=tmp_path, timeout=840)
    records = metrics(tmp_path / "runs" / "verifiers-copy")
    first, last = records[:len(records) // 10], records[-(len(records) // 10):]
    start = sum(r["reward_mean"] for r in first) / len(first)
    end = sum(r["reward_mean"] for r in last) / len(last)
    print(f"verifiers copy: reward {start:.3f} (first 10%) -> {end:.3f} (last 10%)")
    assert start < 0.25 and end >= 0.6, (start, end)
