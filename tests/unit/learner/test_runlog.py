"""A full disk never costs a run its metrics or its summary (issue 18 finding 2)."""

from __future__ import annotations

import errno
import json

import pytest

from streamrl import config
from streamrl.learner import runlog as runlog_mod
from streamrl.learner.runlog import RunLog
from streamrl.run import storage


def _record(step: int) -> dict:
    return {"step": step, "reward_mean": 0.5, "step_s": 0.1}


def test_a_metrics_line_the_disk_cannot_take_is_cut_back_and_named(tmp_path, monkeypatch):
    log = RunLog(config.load(None, [f"run_dir={tmp_path}", "name=r"]))
    log.open(resumed_step=0)
    log.step(_record(0))
    real_write = runlog_mod.os.write

    def half_then_full(fd, data):  # the disk takes part of the line, then refuses the rest
        if len(data) > 10:
            return real_write(fd, bytes(data[:10]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runlog_mod.os, "write", half_then_full)
    with pytest.raises(storage.DiskFull, match=r"disk full \(No space left on device\) writing metrics .*metrics.jsonl"):
        log.step(_record(1))
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0]
    log.close()


def test_the_summary_goes_into_its_reserved_space_when_the_disk_is_full(tmp_path, monkeypatch):
    log = RunLog(config.load(None, [f"run_dir={tmp_path}", "name=r"]))
    log.open(resumed_step=0)
    log.step(_record(0))
    path = tmp_path / "r" / "summary.json"
    assert json.loads(path.read_text()) == {"status": "running"} and path.stat().st_size >= runlog_mod.SUMMARY_RESERVE_BYTES

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runlog_mod.jsonfiles, "write", full)  # no room for a new file
    log.summary({"status": "failed", "error": "disk full (No space left on device) writing ..."}, (0.0, 1.0))
    s = json.loads(path.read_text())
    assert s["status"] == "failed" and s["error"].startswith("disk full") and s["steps"] == 1
    log.close()
