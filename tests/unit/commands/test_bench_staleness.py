"""The staleness bench's table: means over seeds, ratios to the task's strict (lag-0) runs, and the shares at full
lag only; and its config for an unknown task is refused by name."""

from __future__ import annotations

import pytest

from streamrl.bench import staleness


def _run(obj, lag, seed, final, clipped=0.1):
    per_step = [{"lag_max": min(i, lag), "lag_mean": min(i, lag), "clipped_fraction": 0.9 if i < lag else clipped,
                 "truncated_fraction": 0.0, "masked_fraction": 0.0, "is_ess_fraction": 1.0, "is_ratio_max": 1.5}
                for i in range(4)]
    return {"task": "reverse", "objective": obj, "lag": lag, "seed": seed, "steps": 4, "final_reward": final,
            "per_step": per_step}


def test_ratios_are_to_the_mean_of_the_shared_strict_runs_and_shares_count_full_lag_steps_only():
    runs = [_run("token_pg", 0, 0, 0.5, 0.0), _run("token_pg", 0, 1, 0.7, 0.0),
            _run("token_pg", 2, 0, 0.3), _run("token_pg", 2, 1, 0.5), _run("tis", 2, 0, 0.6), _run("tis", 2, 1, 0.6)]
    rows = {(r["objective"], r["lag"]): r for r in staleness.table(runs)}
    assert set(rows) == {("token_pg", 0), ("token_pg", 2), ("tis", 0), ("tis", 2)}
    assert rows["tis", 0]["per_seed"] == [0.5, 0.7] and rows["tis", 0]["ratio_to_strict"] == 1.0  # shared strict
    assert rows["token_pg", 0]["ratio_to_strict"] == 1.0
    assert rows["token_pg", 2]["ratio_to_strict"] == pytest.approx(0.4 / 0.6)
    assert rows["tis", 2]["ratio_to_strict"] == pytest.approx(1.0)  # tis has no lag 0 of its own: the task's strict
    assert rows["tis", 2]["seeds"] == 2 and rows["tis", 2]["per_seed"] == [0.6, 0.6]
    assert rows["token_pg", 2]["clipped_fraction"] == pytest.approx(0.1)  # steps 0-1 (lag < 2) left out


def test_an_unknown_task_is_refused_with_the_allowed_names():
    with pytest.raises(ValueError, match="task 'nope' unknown; allowed: reverse, copy, copy-long, chat-dataset"):
        staleness._config("nope", "token_pg", 0, 10, [])


def test_a_multi_step_objectives_own_lag_0_is_not_strict_and_its_ratios_stay_against_the_strict_runs():
    own = [dict(_run("decoupled_ppo-2step", 0, s, 0.9), strict=False) for s in (0, 1)]
    runs = [dict(_run("token_pg", 0, 0, 0.5, 0.0), strict=True), dict(_run("token_pg", 0, 1, 0.7, 0.0), strict=True),
            *own, _run("decoupled_ppo-2step", 2, 0, 0.3), _run("decoupled_ppo-2step", 2, 1, 0.3)]
    rows = {(r["objective"], r["lag"]): r for r in staleness.table(runs)}
    assert rows["token_pg", 0]["strict"] and not rows["decoupled_ppo-2step", 0]["strict"]
    assert rows["decoupled_ppo-2step", 0]["ratio_to_strict"] == pytest.approx(0.9 / 0.6)
    assert rows["decoupled_ppo-2step", 2]["ratio_to_strict"] == pytest.approx(0.3 / 0.6)


def test_objectives_name_a_loss_a_loss_with_overrides_or_a_named_variant():
    assert staleness.objective_overrides("tis") == ["loss.name=tis"]
    assert staleness.objective_overrides("tis@loss.tis_cap=1@seed=3") == ["loss.name=tis", "loss.tis_cap=1", "seed=3"]
    assert staleness.objective_overrides("decoupled_ppo-4step") == ["loss.name=decoupled_ppo", "learner.minibatches=4"]
    cfg = staleness._config("reverse", "decoupled_ppo-2step", 0, 10, [])
    assert (cfg.loss.name, cfg.learner.minibatches) == ("decoupled_ppo", 2)
