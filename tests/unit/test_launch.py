"""`streamrl run` picks ports that no outgoing connection can take while the learner starts, and its
exit status tells a finished run from every other ending."""

from __future__ import annotations

import json
import signal
import socket

import pytest

from streamrl.commands import launch
from streamrl.commands.launch import free_ports


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    ports = free_ports(8)
    assert len(set(ports)) == 8 and all(20000 <= p < low for p in ports)
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_exit_statuses_tell_a_finished_run_from_every_other_ending(tmp_path):
    from streamrl.commands.launch import EXIT_STATUSES, outcome

    log = tmp_path / "learner.log"
    log.write_text("12:00:00 learner ERROR failed\nTraceback ...\nstreamrl learner: error: TimeoutError: no group\n")
    done, stopped = {"status": "finished"}, {"status": "stopped"}
    assert outcome(0, done, None, None, log) == (0, None)
    assert outcome(0, stopped, signal.SIGINT, None, log) == (130, None)
    assert outcome(0, stopped, signal.SIGTERM, None, log) == (143, None)
    assert outcome(-signal.SIGKILL, None, signal.SIGINT, None, log) == (130, None)  # a second Ctrl-C killed it
    assert outcome(0, stopped, None, "every actor failed", log)[0] == 3
    assert outcome(0, stopped, None, None, log)[0] == 4
    code, line = outcome(1, None, None, None, log)
    assert code == 1 and line == f"learner failed: TimeoutError: no group (traceback in {log})"
    code, line = outcome(-signal.SIGKILL, None, None, None, log)
    assert code == 1 and line == f"learner was killed by SIGKILL (its log: {log})"
    code, line = outcome(1, {"status": "failed", "error": "disk full (...) writing x"}, None, None, log)
    assert code == 1 and line.startswith("learner failed: disk full")
    documented = {code for code, _ in EXIT_STATUSES}
    assert {0, 1, 2, 3, 4, 130, 143} == documented


def test_the_exit_statuses_are_in_run_help(capsys):
    from streamrl.commands import cli

    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    out = capsys.readouterr().out
    assert "exit status:" in out and "130" in out and "143" in out and "every actor failed" in out


def test_a_resumed_runs_earlier_steps_are_not_shown_as_new_progress(tmp_path, monkeypatch):
    """The tail skips the lines metrics.jsonl held before the resumed learner started."""
    metrics = tmp_path / "metrics.jsonl"
    old = [json.dumps({"step": i, "t": 1.0}) for i in range(6)]
    metrics.write_text("".join(x + "\n" for x in old))
    seen = launch._line_hashes(metrics)
    metrics.write_text("".join(x + "\n" for x in old[:3]))  # the learner keeps steps < 3 (its checkpoint) ...
    with open(metrics, "a") as f:                          # ... and redoes 3, 4, 5
        f.write("".join(json.dumps({"step": i, "t": 2.0}) + "\n" for i in range(3, 6)))
    new = [json.loads(x)["step"] for x in launch._Tail(metrics).lines() if hash(x) not in seen]
    assert new == [3, 4, 5]
