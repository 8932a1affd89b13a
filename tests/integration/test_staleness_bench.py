"""`streamrl bench staleness --short`: the forced-lag sweep end to end (real rollouts, the DeepSpeed engine, the
final-policy eval) on 2 lags × 2 objectives, 1 seed, 8 steps: the table's shape, the exact lag of every step, the
shared strict runs and the files it writes."""

from __future__ import annotations

import json

from procs import streamrl


def test_staleness_short_trains_at_exactly_the_forced_lag_and_tabulates_ratios_to_strict(tmp_path):
    out = streamrl("bench", "staleness", "--short", "--objectives", "token_pg", "tis", "--out", str(tmp_path / "o"),
                   cwd=tmp_path, timeout=240).stdout.splitlines()
    rows = [line for line in out if line.startswith("bench=staleness ")]
    assert len(rows) == 4  # token_pg at lags 0 and 2, tis at lags 0 (strict, shared) and 2
    done = json.loads((tmp_path / "o" / "staleness.json").read_text())
    runs = done["runs"]
    # lag 0 runs once (with the first objective): strict is every objective's reference
    assert sorted((r["objective"], r["lag"]) for r in runs) == [("tis", 2), ("token_pg", 0), ("token_pg", 2)]
    for r in runs:
        assert len(r["per_step"]) == r["steps"] == 8
        # the batch consumed at version v came from version max(0, v - k): the learner's own lag says so
        assert [s["lag_max"] for s in r["per_step"]] == [min(i, r["lag"]) for i in range(8)]
        assert all(s["lag_mean"] == s["lag_max"] for s in r["per_step"])
        assert 0.0 <= r["final_reward"] <= 1.0 and r["eval_prompts"] == 128
    strict = next(r["final_reward"] for r in runs if r["lag"] == 0)
    table = {(t["objective"], t["lag"]): t for t in done["table"]}
    assert set(table) == {("token_pg", 0), ("token_pg", 2), ("tis", 0), ("tis", 2)}
    assert table["tis", 0]["ratio_to_strict"] == table["token_pg", 0]["ratio_to_strict"] == 1.0
    for obj in ("token_pg", "tis"):
        run = next(r for r in runs if (r["objective"], r["lag"]) == (obj, 2))
        assert abs(table[obj, 2]["ratio_to_strict"] - run["final_reward"] / strict) < 1e-9
    assert table["token_pg", 0]["clipped_fraction"] == 0.0  # on-policy: nothing for the clip to remove
    assert (tmp_path / "o" / "staleness.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
