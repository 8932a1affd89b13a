"""learner.schedule.due: the one place both learner loops (rank 0 and ranks > 0) learn what follows a step."""

from __future__ import annotations

import ast
from pathlib import Path

from streamrl.config import load
from streamrl.learner import schedule

REPO = Path(__file__).resolve().parents[3]


def test_every_n_counts_steps_done_and_zero_means_never():
    cfg = load(None, ["learner.weight_stats_every=10", "eval.every=4", "learner.checkpoint_every=0"])
    dues = [schedule.due(step, step, cfg) for step in range(20)]
    assert [s for s, d in enumerate(dues) if d.weight_stats] == [9, 19]
    assert [s for s, d in enumerate(dues) if d.evaluate] == [3, 7, 11, 15, 19]
    assert not any(d.checkpoint for d in dues)
    assert all(d.publish for d in dues)  # publish_every 1 (the default): every version goes out


def test_publishing_follows_the_version_it_makes_not_the_step():
    cfg = load(None, ["learner.publish_every=3", "learner.checkpoint_every=5"])
    # A resumed learner: version 7 at step 2 (the versions run ahead of the steps of this life).
    assert [schedule.due(2 + i, 7 + i, cfg).publish for i in range(6)] == [False, True, False, False, True, False]
    assert [s for s in range(12) if schedule.due(s, 100, cfg).checkpoint] == [4, 9]


def test_both_learner_loops_ask_the_schedule_and_repeat_none_of_its_conditions():
    # A condition copied into one loop could drift from the other: under ZeRO-3 that hangs a run.
    for path in ("learner/main.py", "learner/follower.py"):
        src = (REPO / path).read_text()
        assert "schedule.due(" in src, path
        names = {n.attr for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Attribute)}
        assert not names & {"publish_every", "weight_stats_every", "checkpoint_every", "every"}, path


def test_a_version_due_for_evaluation_is_published_whatever_publish_every_says():
    cfg = load(None, ["learner.publish_every=3", "eval.every=4"])  # the actors evaluate a version they receive
    dues = [schedule.due(step, step, cfg) for step in range(12)]
    assert [s for s, d in enumerate(dues) if d.publish] == [2, 3, 5, 7, 8, 11]  # versions 3, 6, 9, 12 and 4, 8
    assert all(d.publish for d in dues if d.evaluate)
