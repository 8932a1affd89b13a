"""`streamrl bench --short` runs and reports every figure as a ratio (CI proves it runs, not how fast)."""

from __future__ import annotations

import pytest

from procs import streamrl


@pytest.mark.long
def test_bench_short_reports_ratios_against_same_run_references(tmp_path):
    out = streamrl("bench", "--short", cwd=tmp_path, timeout=500).stdout.splitlines()
    transport = [line for line in out if line.startswith("bench=transport")]
    adv = [line for line in out if line.startswith("bench=advantages")]
    assert len(transport) == 4 and all("ratio_vs_raw_zmq=" in line and "ratio_vs_memcpy=" in line
                                       and "ratio_masked_vs_plain=" in line and "codec_ratio_turns_vs_none=" in line
                                       for line in transport)
    assert len(adv) == 2 and all("ratio_vs_bare_expression=" in line for line in adv)
    batching = [line for line in out if line.startswith("bench=batching")]
    assert len(batching) == 2 and all("ratio_vs_copying_the_bytes=" in line for line in batching)
    weights = [line for line in out if line.startswith("bench=weights")]
    assert len(weights) == 3 and "layout=qwen3" in weights[-1] and all("ratio_vs_raw_zmq=" in line and "publisher_blocked_fraction=" in line
                                     for line in weights)
    assert all(int(line.split("chunks=")[1].split()[0]) > 1 for line in weights)  # versions crossed as chunks
    assert all(float(line.split("host_copy_blocked_ratio=")[1].split()[0]) > 0 for line in weights)
    overlap = [line for line in out if line.startswith("bench=overlap")]
    assert len(overlap) == 1 and "ratio_vs_ideal=" in overlap[0] and "actor_idle_fraction=" in overlap[0]
    startup = [line for line in out if line.startswith("bench=startup")]  # one run, with the forked children
    assert len(startup) == 1 and "mode=fork" in startup[0] and "ratio_vs_bare_imports=" in startup[0]
    assert all(f" {phase}_s=" in startup[0] for phase in ("launch", "preload", "model", "engine", "first_step"))
    generate = [line for line in out if line.startswith("bench=generate")]
    assert len(generate) == 1 and "speedup=" in generate[0] and "same_samples=True" in generate[0]
    episodes = [line for line in out if line.startswith("bench=episodes")]  # 64 episodes, 4 turns, a 50 ms tool
    assert len(episodes) == 1 and "ratio_vs_single_turn=" in episodes[0]
    assert float(episodes[0].split("tool_s_per_call=")[1].split()[0]) > 64 * 0.05  # every episode called it
    endpoint = [line for line in out if line.startswith("bench=endpoint")]  # 1 and 16 requests at a time
    assert len(endpoint) == 2 and all("ratio_vs_direct=" in line and "overhead_ms=" in line for line in endpoint)
    agents = [line for line in out if line.startswith("bench=agents")]  # the two-turn task as agent and as env
    assert len(agents) == 1 and "ratio_agent_vs_env=" in agents[0] and "ratio_floor=" in agents[0]
    learner = [line for line in out if line.startswith("bench=learner ")]
    assert len([line for line in out if line.startswith("bench=learner_logprob_chunk")]) == 1
    assert len(learner) == 1 and "vocab=151936" in learner[0] and "ratio_vs_plain=" in learner[0]
    assert float(learner[0].split("loss_diff_plain=")[1].split()[0]) < 1e-4  # the same step from the same weights
    proximal = [line for line in out if line.startswith("bench=proximal")]  # A-3PO against the proximal forward
    assert len(proximal) == 1 and "vocab=151936" in proximal[0] and "ratio_forward_over_interpolate=" in proximal[0]
    dealer = [line for line in out if line.startswith("bench=dealer")]  # in process, then the same runs both ways
    assert len(dealer) == 2 and "ratio_dealt_vs_drawn=" in dealer[0] and "ratio_dealt_vs_drawn=" in dealer[1]
    assert "dealt_lost_at_shutdown=[0]" in dealer[1]  # the last epoch's prompts all train: none is generated to be lost
    for line in transport + adv + batching:
        ratio = float(line.rsplit("=", 1)[1])
        assert 0 < ratio < 100
    delta = [line for line in out if line.startswith("bench=delta")]  # real steps at lr 1e-6, release shape
    assert [line.split()[0:2] for line in delta] == [["bench=delta_sizes", "dtype=bfloat16"], ["bench=delta_sizes",
                                                     "dtype=float32"], ["bench=delta_transfer", "dtype=bfloat16"]]
    changed = float(delta[0].split("changed_median=")[1].split()[0])
    assert 0 < changed < 0.5 and float(delta[0].split("bytes_ratio=")[1].split()[0]) > 1  # sparse, and smaller
    assert float(delta[2].split("speedup=")[1]) > 0
