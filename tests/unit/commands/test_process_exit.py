"""`streamrl learner`: a rank of a multi-rank learner leaves at once when its run is done, without the
interpreter's teardown (where a collective backend's threads can abort a finished rank); a lone learner returns
as any command does."""

from __future__ import annotations

import argparse

import pytest

from streamrl.commands import process


class Exited(Exception):
    pass


@pytest.mark.parametrize("world, leaves", [("2", True), ("1", False), (None, False)])
def test_a_finished_rank_of_a_multi_rank_learner_leaves_without_the_interpreters_teardown(monkeypatch, world, leaves):
    ran: list = []
    monkeypatch.setattr("streamrl.learner.main.run", lambda cfg, phases: ran.append(cfg.steps))
    monkeypatch.setattr(process.start, "before_start", lambda cfg, args, name: True)

    def exit_now(code):
        raise Exited(code)

    monkeypatch.setattr(process.os, "_exit", exit_now)
    if world is None:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", world)
    args = argparse.Namespace(command="learner", args=["steps=3"], local_rank=None, overwrite=False)
    if leaves:
        with pytest.raises(Exited) as exited:
            process.main(args)
        assert exited.value.args == (0,) and ran == [3]  # after the run, with status 0
    else:
        assert process.main(args) == 0 and ran == [3]
