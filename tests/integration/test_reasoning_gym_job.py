"""reasoning-gym in the tiny job: `streamrl run configs/reasoning-gym-tiny.yaml` (spell_backward, its partial
credit as the ordinal reward) trains the tiny CPU model, and the reward rises."""

from __future__ import annotations

import pytest
from procs import FREE_PORTS, REPO, metrics, streamrl, summary

pytest.importorskip("reasoning_gym")
pytestmark = pytest.mark.slow


@pytest.mark.long
def test_the_tiny_model_learns_a_reasoning_gym_task(tmp_path):
    streamrl("run", str(REPO / "configs" / "reasoning-gym-tiny.yaml"), f"run_dir={tmp_path / 'runs'}", *FREE_PORTS,
             cwd=tmp_path, timeout=600)
    run = tmp_path / "runs" / "reasoning-gym-tiny"
    s = summary(run)
    assert len(metrics(run)) == s["steps"] == 200
    # From near zero (a random word rarely resembles the reversed one) to a clearly higher mean level.
    assert s["reward_first_10pct"] < 0.2 and s["improvement_fraction_of_range"] >= 0.2, s
