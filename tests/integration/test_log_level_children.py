"""`streamrl run --log-level debug`: the learner and actors it starts log at that level, forked or fresh."""

from __future__ import annotations

import pytest
from procs import FREE_PORTS, REPO, streamrl, summary

pytestmark = pytest.mark.slow


@pytest.mark.long
@pytest.mark.parametrize("fork", ["1", "0"])
def test_the_processes_streamrl_run_starts_inherit_its_log_level(tmp_path, monkeypatch, fork):
    monkeypatch.setenv("STREAMRL_FORK", fork)
    monkeypatch.delenv("STREAMRL_LOG_LEVEL", raising=False)
    streamrl("run", "--log-level", "debug", str(REPO / "configs" / "tiny.yaml"), "steps=2", "name=loud",
             "actors.num=1", *FREE_PORTS, "monitoring.learner_port=0", "monitoring.actor_port=0", cwd=tmp_path)
    run = tmp_path / "runs" / "loud"
    assert summary(run)["status"] == "finished"
    for who in ("learner", "actor-0"):
        log = (run / "logs" / f"{who}.log").read_text()
        # the child read the run's config.yaml: a DEBUG line, under its own name (not the launcher's)
        assert f"{who} DEBUG config: reading runs/loud/config.yaml" in log, log[-2000:]
        assert " run DEBUG " not in log
