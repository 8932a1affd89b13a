"""Evaluation tools on a real run: periodic eval, `streamrl eval` (saved and live), `uplift`, `difficulty`."""

from __future__ import annotations

import json

import pytest
from procs import FREE_PORTS, REPO, metrics, streamrl

pytestmark = pytest.mark.slow
TINY = str(REPO / "configs" / "tiny.yaml")
QUIET = ["monitoring.learner_port=0", "monitoring.actor_port=0"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A 20-step tiny run whose actors evaluate it every 10 steps."""
    tmp = tmp_path_factory.mktemp("eval")
    streamrl("run", TINY, "name=ev", f"run_dir={tmp / 'runs'}", "steps=20", "eval.every=10", *FREE_PORTS, *QUIET,
             cwd=tmp)
    return tmp / "runs" / "ev"


def test_periodic_eval_records_every_n_steps_and_the_saved_policy_reproduces_the_last(finished_run):
    recs = metrics(finished_run)
    evals = [r for r in recs if "eval/pass@1" in r]  # run on the actors, recorded as they come back
    assert [r["eval_step"] for r in evals] == [9, 19] and [r["eval_version"] for r in evals] == [10, 20]
    assert (finished_run / "checkpoints" / "step-20" / "policy.safetensors").is_file()
    streamrl("eval", str(finished_run), cwd=finished_run)
    got = json.loads((finished_run / "eval.json").read_text())
    assert (got["step"], got["policy_version"], got["eval/prompts"], got["eval/samples"]) == (20, 20, 32, 8)
    assert 0 <= got["eval/pass@1"] <= got["eval/pass@4"] <= got["eval/pass@8"] <= 1
    for key in ("eval/mean@1", "eval/mean@4", "eval/mean@8", "eval/reward@8", "eval/reward_mean", "eval/unparseable"):
        assert 0 <= got[key] <= 1, key
    assert got["eval/reward@8"] == pytest.approx(got["eval/reward_mean"])
    # pass@1 is c/n over all n samples; mean@k over the first k of them: with k = n they are the same share
    assert got["eval/mean@8"] == pytest.approx(got["eval/pass@1"])
    # Same weights, shards and seeds as the actors' evaluation of version 20: the checkpoint is the trained policy.
    assert {k: v for k, v in got.items() if k.startswith("eval/")} == {
        k: v for k, v in evals[-1].items() if k.startswith("eval/")}


def test_a_path_that_is_not_a_run_is_one_clear_line(tmp_path):
    proc = streamrl("eval", str(tmp_path), cwd=tmp_path, check=False, timeout=60)
    assert proc.returncode == 2 and "not a run directory" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_uplift_writes_ratios_per_initial_likelihood_bucket(finished_run):
    # A lower bar for "correct" (1 of 4 symbols right) so the random-init policy has many correct samples.
    streamrl("uplift", str(finished_run), "advantage.r_min_correct=0.25", "--prompts", "8", "--samples", "16",
             "--buckets", "3", cwd=finished_run)
    got = json.loads((finished_run / "uplift.json").read_text())
    assert got["post"].endswith("step-20/policy.safetensors") and got["pre"].startswith("initial policy")
    assert 0 < got["samples_correct"] <= got["samples_total"] == 8 * 16
    bs = got["buckets"]
    assert [b["bucket"] for b in bs] == [0, 1, 2] and sum(b["count"] for b in bs) == got["samples_correct"]
    assert bs[0]["rank_lo"] == 0 and bs[-1]["rank_hi"] < 16   # ranks within a prompt: at most 16 answers each
    assert got["prompts_with_correct"] <= 8
    for b in bs:
        assert set(b) == {"bucket", "rank_lo", "rank_hi", "count", "mean_log_ratio", "geo_mean_ratio", "mean_ratio"}
        assert b["geo_mean_ratio"] <= b["mean_ratio"] * (1 + 1e-9)  # AM-GM


def test_difficulty_keeps_only_prompts_inside_the_band(finished_run, tmp_path):
    out = tmp_path / "kept.jsonl"
    proc = streamrl("difficulty", "--checkpoint", str(finished_run), "--out", str(out), "--rollouts", "8",
                    "--prompts", "16", "advantage.r_min_correct=0.25", "difficulty.low=0.2", "difficulty.high=0.8",
                    cwd=tmp_path)
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    assert f"kept {len(kept)} of 16 prompts" in proc.stdout
    assert all(0.2 <= k["success_rate"] <= 0.8 and k["id"] for k in kept)


def test_live_eval_follows_a_running_learners_weights(interrupted_run):
    # A run that `streamrl eval --live` followed while it trained (conftest.py; test_loop's Ctrl-C ends it).
    run, ev = interrupted_run.run, interrupted_run.live_eval
    assert ev.returncode == 0, ev.stdout[-3000:] + ev.stderr[-3000:]
    lines = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and lines[0]["policy_version"] < lines[1]["policy_version"]
    assert json.loads((run / "eval.json").read_text()) == lines[1]
    assert all(r["eval/prompts"] == 8 and 0 <= r["eval/pass@8"] <= 1 for r in lines)
    assert ev.stdout.count("streamrl eval: version") == 2
