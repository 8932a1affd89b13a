"""`streamrl bench staleness --short`: the forced-lag sweep end to end (real rollouts, the DeepSpeed engine, the
final-policy eval) on 2 lags × 2 objectives, 1 seed, 8 steps: the table's shape, the exact lag of every step, the
shared strict runs and the files it writes."""

from __future__ import annotations

import json

import pytest
from procs import streamrl


@pytest.mark.long
def test_staleness_short_trains_at_exactly_the_forced_lag_and_tabulates_ratios_to_strict(tmp_path):
    out = streamrl("bench", "staleness", "--short", "--objectives", "token_pg", "tis", "decoupled_ppo-2step",
                   "--out", str(tmp_path / "o"), cwd=tmp_path, timeout=300).stdout.splitlines()
    rows = [line for line in out if line.startswith("bench=staleness ")]
    assert len(rows) == 6  # token_pg, tis (its lag 0: strict, shared) and decoupled_ppo-2step at lags 0 and 2
    done = json.loads((tmp_path / "o" / "staleness.json").read_text())
    runs = done["runs"]
    # lag 0 runs once (with the first objective): strict is every objective's reference; an objective of two
    # optimizer steps per batch runs its own lag 0, which is not strict
    assert sorted((r["objective"], r["lag"], r["strict"]) for r in runs) == [
        ("decoupled_ppo-2step", 0, False), ("decoupled_ppo-2step", 2, False), ("tis", 2, False),
        ("token_pg", 0, True), ("token_pg", 2, False)]
    assert len((tmp_path / "o" / "staleness-runs.jsonl").read_text().splitlines()) == 5  # one line as each run ended
    for r in runs:
        assert len(r["per_step"]) == r["steps"] == 8
        assert {s["optimizer_steps"] for s in r["per_step"]} == {2 if r["objective"] == "decoupled_ppo-2step" else 1}
        # the batch consumed at version v came from version max(0, v - k): the learner's own lag says so
        assert [s["lag_max"] for s in r["per_step"]] == [min(i, r["lag"]) for i in range(8)]
        assert all(s["lag_mean"] == s["lag_max"] for s in r["per_step"])
        assert 0.0 <= r["final_reward"] <= 1.0 and r["eval_prompts"] == 128
    strict = next(r["final_reward"] for r in runs if r["strict"])
    table = {(t["objective"], t["lag"]): t for t in done["table"]}
    assert set(table) == {(o, k) for o in ("token_pg", "tis", "decoupled_ppo-2step") for k in (0, 2)}
    assert table["tis", 0]["ratio_to_strict"] == table["token_pg", 0]["ratio_to_strict"] == 1.0
    for obj in ("token_pg", "tis"):
        run = next(r for r in runs if (r["objective"], r["lag"]) == (obj, 2))
        assert abs(table[obj, 2]["ratio_to_strict"] - run["final_reward"] / strict) < 1e-9
    assert table["token_pg", 0]["clipped_fraction"] == 0.0  # on-policy: nothing for the clip to remove
    assert table["tis", 0]["strict"] and not table["decoupled_ppo-2step", 0]["strict"]
    two_step = next(r for r in runs if (r["objective"], r["lag"]) == ("decoupled_ppo-2step", 0))
    assert abs(table["decoupled_ppo-2step", 0]["ratio_to_strict"] - two_step["final_reward"] / strict) < 1e-9
    assert (tmp_path / "o" / "staleness.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
