"""A SkyRL-Gym env, unchanged, multi-turn on a real vLLM engine (the vllm-cpu build; skipped where vllm is not
importable): examples/skyrl-gym-copy's two-turn BaseTextEnv played by a vLLM actor, strictly on-policy, so every
step proves that the engine's log-probs of the model's tokens, sampled over the episode's growing ids (its first
turn and the env's "next" between), are the learner's recomputation over the ids the episode holds."""

from __future__ import annotations

import ast
import re

import pytest
from procs import FREE_PORTS, REPO, metrics, streamrl, summary

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
EXAMPLE = REPO / "examples" / "skyrl-gym-copy"
# vLLM's CPU attention wants head_dim 64: hidden 128 over 2 heads (as tests/integration/test_vllm_cpu.py).
VLLM_MODEL = ["actors.backend=vllm", "model.hidden_size=128", "model.num_heads=2"]
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}


def test_skyrl_gym_episodes_on_vllm_train_strictly_on_the_tokens_the_engine_sampled(tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    pytest.importorskip("skyrl_gym")
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    steps = 3
    streamrl("run", str(EXAMPLE / "config.yaml"), f"task.data={EXAMPLE / 'train.jsonl'}",
             f"task.environment={EXAMPLE / 'copy_env.py'}:CopyEnv", f"run_dir={tmp_path}", f"steps={steps}",
             "on_policy=strict", "actors.num=1", "learner.batch_groups=4", "actors.weights_timeout_s=600",
             *VLLM_MODEL, *FREE_PORTS, "monitoring.learner_port=0", "monitoring.actor_port=0",
             cwd=tmp_path, timeout=600)
    run = tmp_path / "skyrl-gym-copy"
    recs, s = metrics(run), summary(run)
    line = next(x for x in (run / "logs" / "actor-0.log").read_text().splitlines() if ": done {" in x)
    report = ast.literal_eval(re.sub(r"^.*?: done ", "", line))
    print(f"\nskyrl_gym on vllm: {report['episodes']} episodes, turns {report['episode_turns_mean']}, largest "
          f"|ratio - 1| {max(x['is_ratio_max_abs_dev'] for x in recs):.2e}")
    assert s["status"] == "finished" and s["learner_version"] == steps, s
    assert report["episodes"] > 0 and report["episode_turns_mean"] == 2.0, report
    assert report["episodes_step_raised"] == 0 and report["episodes_template_drift"] == 0, report
    assert all(x["lag_max"] == 0 for x in recs)
    assert max(x["is_ratio_max_abs_dev"] for x in recs) < 1e-3
