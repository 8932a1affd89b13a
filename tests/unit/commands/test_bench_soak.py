"""`streamrl bench soak`'s arithmetic: the RSS slope per 1,000 steps and the lines of a growing file."""

from __future__ import annotations

import pytest

from streamrl.bench import cli, soak


def test_the_slope_is_megabytes_per_thousand_steps_by_least_squares():
    flat = [(s, 400.0 + (0.5 if s % 2 else -0.5)) for s in range(100, 3000, 10)]  # noise, no trend
    assert abs(soak.slope_per_1k(flat)) < 0.05
    leak = [(s, 400.0 + 0.004 * s) for s in range(0, 5000, 50)]  # 4 KB a step
    assert soak.slope_per_1k(leak) == pytest.approx(4.0)
    assert soak.slope_per_1k([(1, 1.0), (1, 2.0)]) is None  # one step: no slope to speak of


def test_lines_counts_only_what_was_appended(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = soak._Lines(path)
    assert lines() == 0  # not there yet
    path.write_text('{"step": 0}\n{"step": 1}\n')
    assert lines() == 2
    with open(path, "a") as f:
        f.write('{"step": 2}\n{"st')  # a line half-written counts once it is whole
    assert lines() == 3


def test_soak_runs_only_when_named():
    assert "soak" in cli.names() and "soak" not in cli.BENCHES
