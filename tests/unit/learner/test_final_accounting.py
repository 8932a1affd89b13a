"""learner.final_accounting: a resume from the checkpoint a learner ended at goes on from that learner's final
accounting (its actors' reports, what it drained at shutdown), and from the checkpoint's own in every other case."""

from __future__ import annotations

from streamrl.learner import final_accounting


def _intake(used: int, received: int, lost: int = 0) -> dict:
    return {"used": used, "dropped": {"lost_at_shutdown": lost} if lost else {}, "demands_sent": 0,
            "receiver": {"received": received, "duplicates": 0, "rejected": {}, "sessions": []}}


def test_a_resume_from_the_checkpoint_a_learner_ended_at_goes_on_from_its_final_accounting(tmp_path):
    saved = {"step": 4, "intake": _intake(64, 70)}
    end = _intake(64, 118, lost=48)
    final_accounting.write(tmp_path, "step-4", 4, end)
    assert final_accounting.resumed(tmp_path, "step-4", saved) == end


def test_any_other_checkpoint_or_an_end_that_does_not_continue_it_resumes_the_checkpoints_own(tmp_path):
    saved = {"step": 4, "intake": _intake(64, 70)}
    assert final_accounting.resumed(tmp_path, "step-4", saved) == saved["intake"]  # no file
    final_accounting.write(tmp_path, "step-2", 2, _intake(32, 40))  # an older life's end
    assert final_accounting.resumed(tmp_path, "step-4", saved) == saved["intake"]
    final_accounting.write(tmp_path, "step-4", 4, _intake(80, 90))  # trained past the checkpoint: not its end
    assert final_accounting.resumed(tmp_path, "step-4", saved) == saved["intake"]
    final_accounting.write(tmp_path, "step-4", 4, _intake(64, 60))  # fewer groups than the checkpoint had
    assert final_accounting.resumed(tmp_path, "step-4", saved) == saved["intake"]
    (tmp_path / final_accounting.FILE).write_text('{"checkpoint": "step-4", "st')  # cut short
    assert final_accounting.resumed(tmp_path, "step-4", saved) == saved["intake"]
