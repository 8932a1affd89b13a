"""The learner's dealing: requests answered from the dealer, groups kept only when dealt, the ledger cut on resume."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import pytest

from streamrl.comm import wire
from streamrl.learner.dealing import CURSOR, LEDGER, Dealing


class Task:
    def __init__(self, rows: int):
        self.train = [f"row {i}" for i in range(rows)]

    @staticmethod
    def prompt(row):
        return NS(id="id-" + row.split()[1])


def _cfg(tmp_path, seed: int = 0, epochs: int = 2):
    return NS(run_path=tmp_path, seed=seed, task=NS(epochs=epochs, data="rows.jsonl"),
              learner=NS(data_timeout_s=300.0), eval=NS(every_epoch=True))


def _ask(d: Dealing, actor: str, session: str, want: int, **kw) -> list:
    return d.deal(wire.PromptsRequest(actor_id=actor, session=session, want=want, **kw)).rows


def _group(session: str, row: int):
    return NS(session=session, prompt_id=f"id-{row}", layer=1)


def _ledger(tmp_path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / LEDGER).read_text().splitlines()]


def test_only_a_dealt_prompts_group_is_kept_and_its_training_is_one_ledger_line(tmp_path):
    d = Dealing(_cfg(tmp_path), Task(4), step=0)
    (e, row), *_ = _ask(d, "actor-0", "s0", 2)
    assert not d.accept(_group("s1", row))  # another session's: not dealt to it
    assert d.accept(_group("s0", row))
    d.trained([_group("s0", row)], step=0, version=0)
    (line,) = _ledger(tmp_path)
    assert line.pop("time") > 0
    assert line == {"id": f"id-{row}", "row": row, "epoch": 1, "outcome": "trained", "step": 0, "version": 0}


def test_an_actor_restarted_gives_back_what_its_old_session_held(tmp_path):
    d = Dealing(_cfg(tmp_path, epochs=1), Task(3), step=0)
    held = _ask(d, "actor-0", "old", 2)
    assert sorted(_ask(d, "actor-0", "new", 3)) == sorted([*held, *[t for t in d.dealer.out if t not in held]])


def test_filtered_and_dropped_reports_are_recorded_and_dealt_again(tmp_path):
    d = Dealing(_cfg(tmp_path, epochs=1), Task(2), step=0)
    (_, a), (_, b) = _ask(d, "actor-0", "s", 2)
    assert _ask(d, "actor-0", "s", 0, filtered=[f"id-{a}"], learner="earlier") == []  # another learner's: ignored
    again = _ask(d, "actor-0", "s", 2, filtered=[f"id-{a}"], dropped={f"id-{b}": "unscored"}, learner=d.learner)
    assert again == [(0, b)]
    assert [(x["row"], x["outcome"]) for x in _ledger(tmp_path)] == [(a, "filtered")]
    assert d.summary()["1"] == {"trained": 0, "filtered": 1, "failed": 0, "redealt": 1}


def test_a_resume_cuts_the_ledger_at_its_checkpoint_and_deals_the_rest_again(tmp_path):
    d = Dealing(_cfg(tmp_path, epochs=1), Task(4), step=0)
    first = _ask(d, "a", "s", 2)
    for t in first:
        d.accept(_group("s", t[1]))
    d.trained([_group("s", t[1]) for t in first], step=0, version=0)
    (tmp_path / "checkpoints" / "step-1").mkdir(parents=True)
    d.save(tmp_path / "checkpoints" / "step-1")
    later = _ask(d, "a", "s", 2)
    for t in later:
        d.accept(_group("s", t[1]))
    d.trained([_group("s", t[1]) for t in later], step=1, version=1)  # trained, then the learner dies
    d.close()
    back = Dealing(_cfg(tmp_path, epochs=1), Task(4), step=1)
    assert [x["row"] for x in _ledger(tmp_path)] == [t[1] for t in first]
    assert sorted(_ask(back, "a", "s2", 4)) == sorted(later)


def test_a_resume_with_other_rows_or_another_seed_is_refused_by_name(tmp_path):
    d = Dealing(_cfg(tmp_path), Task(4), step=0)
    (tmp_path / "checkpoints" / "step-3").mkdir(parents=True)
    d.save(tmp_path / "checkpoints" / "step-3")
    assert (tmp_path / "checkpoints" / "step-3" / CURSOR).is_file()
    with pytest.raises(ValueError, match="seed=0, this run has seed=5"):
        Dealing(_cfg(tmp_path, seed=5), Task(4), step=3)
    with pytest.raises(ValueError, match="task.data=rows.jsonl holds other rows"):
        Dealing(_cfg(tmp_path), Task(5), step=3)


def test_the_step_that_ends_an_epoch_asks_for_an_eval_at_the_first_step_that_publishes(tmp_path):
    from streamrl.learner.schedule import Due

    d = Dealing(_cfg(tmp_path, epochs=2), Task(2), step=0)
    quiet = Due(publish=False, weight_stats=False, evaluate=False, checkpoint=False)
    rows = _ask(d, "a", "s", 2)
    assert [r[0] for r in rows] == [0, 0]
    groups = [_group("s", r[1]) for r in rows[:1]]
    d.accept(groups[0])
    assert not d.trained(groups, 0, 0, quiet._replace(publish=True)).evaluate  # half of epoch 1
    last = [_group("s", rows[1][1])]
    d.accept(last[0])
    assert not d.trained(last, 1, 1, quiet).evaluate  # epoch 1 ended, but this step publishes nothing
    assert d.trained([], 2, 2, quiet._replace(publish=True)).evaluate  # the eval owed, at the next publish
    assert not d.trained([], 3, 3, quiet._replace(publish=True)).evaluate  # once


def test_a_silent_session_s_prompts_are_dealt_to_another_after_half_the_data_timeout(tmp_path, monkeypatch):
    import streamrl.learner.dealing as dealing

    clock = [1000.0]
    monkeypatch.setattr(dealing.time, "monotonic", lambda: clock[0])
    d = Dealing(_cfg(tmp_path, epochs=1), Task(2), step=0)
    held = _ask(d, "actor-0", "dead", 2)
    clock[0] += 100  # under half of learner.data_timeout_s (300 s): still held
    assert _ask(d, "actor-1", "alive", 2) == []
    clock[0] += 60
    assert sorted(_ask(d, "actor-1", "alive", 2)) == sorted(held)
