"""The pieces of a run's claim on its directory (issue 31): the lock, the fingerprint, a checkpoint for another model."""

from __future__ import annotations

import json
import multiprocessing
import os

import pytest
import torch

from streamrl import config
from streamrl.run import fingerprint, lock


def _hold(path, ready, done):
    lock.RunLock(path).acquire("a second run")
    ready.set()
    done.wait(30)


def test_a_locked_run_is_refused_naming_the_holder_and_a_dead_holder_frees_it(tmp_path):
    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(tmp_path / "r", ready, done))
    holder.start()
    assert ready.wait(30)
    assert f"pid {holder.pid} command" in lock.live_holder(tmp_path / "r")
    with pytest.raises(lock.RunLocked, match=rf"in use by a live run \(pid {holder.pid} command .*\); --overwrite is"):
        lock.RunLock(tmp_path / "r").acquire("--overwrite")
    holder.kill()  # no clean exit: the kernel drops the lock
    holder.join()
    assert lock.live_holder(tmp_path / "r") is None
    lock.RunLock(tmp_path / "r").acquire("resume").release()


def test_a_lock_given_back_before_the_run_started_removes_only_a_directory_it_made_and_left_empty(tmp_path):
    fresh = tmp_path / "runs" / "fresh"
    lock.take(fresh, "a second run")
    lock.give_back(fresh)  # a Ctrl-C during start-up: "nothing was written" must be true
    assert not fresh.exists() and lock.live_holder(fresh) is None
    kept = tmp_path / "runs" / "kept"
    kept.mkdir()
    (kept / "metrics.jsonl").write_text("{}\n")  # a finished run's: never removed
    lock.take(kept, "learner.resume=true")
    lock.give_back(kept)
    assert (kept / "metrics.jsonl").exists() and lock.live_holder(kept) is None
    lock.take(kept, "a second run")  # free again
    lock.give_back(kept)
    lock.give_back(tmp_path / "never-taken")  # nothing held: nothing to do


def test_a_child_of_the_holding_supervisor_works_under_its_lock(tmp_path, monkeypatch):
    held = lock.take(tmp_path / "r", "a second run")
    try:
        monkeypatch.setenv(lock.HELD_BY, str(os.getpid()))
        assert lock.held_for_me(tmp_path / "r")
        monkeypatch.setenv(lock.HELD_BY, str(os.getpid() + 1))
        assert not lock.held_for_me(tmp_path / "r")
    finally:
        held.release()


def _cfg(tmp_path, *overrides):
    return config.load(None, [f"run_dir={tmp_path}", "name=r", *overrides])


def test_the_fingerprint_refuses_shaping_changes_and_lists_safe_ones(tmp_path):
    first = _cfg(tmp_path, "steps=3")
    first.run_path.mkdir(parents=True)
    (first.run_path / "config.yaml").write_text(config.dump(first))
    fingerprint.record(first)
    assert json.loads((first.run_path / fingerprint.FILE).read_text())["model.hidden_size"] == first.model.hidden_size
    refusals, _ = fingerprint.compare(_cfg(tmp_path, "model.num_heads=2", "task.name=reverse", "learner.resume=true"))
    assert [r.split(":")[0] for r in refusals] == ["model.num_heads", "task.name"]
    assert fingerprint.resume_problem(_cfg(tmp_path, "learner.resume=true")) is None
    resumed = _cfg(tmp_path, "steps=5", "optim.lr=0.001", "learner.resume=true", "transport.group_port=1234")
    assert fingerprint.accept(resumed) == {"steps": [3, 5], "optim.lr": [0.0003, 0.001]}
    assert fingerprint.describe({"optim.lr": [0.0003, 0.001]}) == "optim.lr 0.0003 -> 0.001"
    line = json.loads((first.run_path / fingerprint.CHANGES).read_text())
    assert line["changes"] == {"steps": [3, 5], "optim.lr": [0.0003, 0.001]}


def test_a_checkpoint_for_another_model_shape_is_called_a_mismatch_not_damage():
    from streamrl.learner.checkpoints import model_mismatch

    with pytest.raises(RuntimeError) as e:
        torch.nn.Linear(4, 8).load_state_dict(torch.nn.Linear(4, 6).state_dict())
    assert model_mismatch(e.value).startswith("size mismatch for weight")
    assert model_mismatch(RuntimeError("unexpected EOF")) is None
