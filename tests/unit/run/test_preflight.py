"""Before anything starts: a wrong run_dir, a taken port, missing keys or a run name that already
holds results are each one line and exit status 2, at once (issue 18 findings 1, 5 and 7)."""

from __future__ import annotations

import json
import socket

import pytest

from streamrl import config
from streamrl.commands import cli, launch
from streamrl.run import preflight

FREE = ["transport.group_port=0", "transport.weights_port=0", "transport.weights_request_port=0",
        "monitoring.learner_port=0", "monitoring.actor_port=0"]


def _errors(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def _finished_run(run_dir, name="x"):
    run = run_dir / name
    (run / "checkpoints" / "step-3").mkdir(parents=True)
    (run / "checkpoints" / "step-3" / "streamrl.json").write_text('{"step": 3, "version": 3}')
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    (run / "summary.json").write_text(json.dumps({"status": "finished", "steps": 3}))
    (run / "config.yaml").write_text("steps: 3\n")
    return run


def test_a_run_name_that_holds_results_is_refused_with_its_options_and_left_untouched(tmp_path, capsys):
    run = _finished_run(tmp_path)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    cfg = config.load(None, [f"run_dir={tmp_path}", "name=x", *FREE])
    assert launch.run(cfg) == 2
    [line] = _errors(capsys)
    assert "already holds a run" in line and "name=" in line and "learner.resume=true" in line and "--overwrite" in line
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert cli.main(["check", f"run_dir={tmp_path}", "name=x", *FREE]) == 0  # check says so, and checks on
    warned = [line for line in _errors(capsys) if "already holds a run" in line]
    assert warned and "warning" in warned[0] and "`streamrl run` would refuse it" in warned[0], warned
    assert preflight.existing_run(config.load(None, [f"run_dir={tmp_path}", "name=x", "learner.resume=true"])) is None


def test_a_resume_of_a_run_without_a_complete_checkpoint_is_refused_and_leaves_it_untouched(tmp_path, capsys):
    run = _finished_run(tmp_path)
    (run / "checkpoints" / "step-3" / "streamrl.json").unlink()  # killed before its first checkpoint completed
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    cfg = config.load(None, [f"run_dir={tmp_path}", "name=x", "learner.resume=true", *FREE])
    assert launch.run(cfg) == 2
    [line] = _errors(capsys)
    assert "no complete checkpoint" in line and "--overwrite" in line and "name=" in line, line
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    fresh = config.load(None, [f"run_dir={tmp_path}", "name=fresh", "learner.resume=true"])
    assert preflight.existing_run(fresh) is None  # nothing there to destroy: a first start


def test_overwrite_moves_the_old_run_aside_and_never_deletes_it(tmp_path):
    run = _finished_run(tmp_path)
    moved = preflight.move_aside(run)
    assert not run.exists() and moved.name.startswith("x.old-") and (moved / "summary.json").is_file()
    _finished_run(tmp_path)
    again = preflight.move_aside(run)  # the same second: a distinct name, the first one kept
    assert again != moved and moved.exists() and again.exists()


@pytest.mark.parametrize("make", ["file", "under_a_file", "read_only"])
def test_a_run_dir_that_cannot_be_written_is_one_line_before_start(tmp_path, capsys, make, monkeypatch):
    target = tmp_path / "f"
    if make in ("file", "under_a_file"):
        target.write_text("x")
        run_dir = target if make == "file" else target / "deeper"
    else:
        target.mkdir()
        run_dir = target

        def refuse(*a, **k):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(preflight.tempfile, "mkstemp", refuse)
    for command in ("check", "run", "learner"):
        assert cli.main([command, f"run_dir={run_dir}", "name=r", *FREE]) == 2
        [line] = _errors(capsys)
        assert f"run_dir={run_dir}" in line and ("is a file" in line or "Permission denied" in line)


def test_a_taken_port_is_reported_at_once_by_check_and_run(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        args = [f"run_dir={tmp_path}", *FREE, f"transport.group_port={port}"]
        for command in ("check", "run", "learner"):
            assert cli.main([command, *args]) == 2
            [line] = _errors(capsys)
            assert f"transport.group_port={port}: already in use" in line
        assert not (tmp_path / "tiny").exists()  # nothing started, nothing written
        # A taken /metrics port costs only the metrics: a warning, not a refusal.
        assert cli.main(["check", f"run_dir={tmp_path}", *FREE, f"monitoring.learner_port={port}"]) == 0
        assert "warning: monitoring.learner_port" in capsys.readouterr().err


def test_two_transport_ports_that_are_the_same_are_refused(tmp_path):
    port = launch.free_ports(1)[0]
    cfg = config.load(None, [f"run_dir={tmp_path}", f"transport.group_port={port}", f"transport.weights_port={port}"])
    assert any("the same as transport.group_port" in p for p in preflight.port_problems(cfg))


def test_a_missing_curve_keys_folder_or_key_fails_check(tmp_path, capsys):
    assert cli.main(["check", f"run_dir={tmp_path}", *FREE, f"transport.curve_keys={tmp_path / 'nokeys'}"]) == 2
    assert "no such folder" in _errors(capsys)[0]
    assert cli.main(["keys", str(tmp_path / "keys"), "--actors", "1"]) == 0
    capsys.readouterr()
    assert cli.main(["check", f"run_dir={tmp_path}", *FREE, f"transport.curve_keys={tmp_path / 'keys'}",
                     "actors.num=2"]) == 2
    [line] = _errors(capsys)
    assert "missing actor-1.key_secret" in line


def test_check_says_that_encryption_is_on(tmp_path, capsys):
    cli.main(["keys", str(tmp_path / "keys"), "--actors", "2"])
    capsys.readouterr()
    assert cli.main(["check", f"run_dir={tmp_path}", *FREE, f"transport.curve_keys={tmp_path / 'keys'}"]) == 0
    assert "CurveZMQ encryption and authentication on" in capsys.readouterr().err
