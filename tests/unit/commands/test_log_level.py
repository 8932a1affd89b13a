"""--log-level on every command, before or after its name; $STREAMRL_LOG_LEVEL when the flag is absent; the level
is handed on through the environment to what `streamrl run` starts (tests/integration/test_log_level.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from streamrl.commands import cli


@pytest.fixture(autouse=True)
def no_level(monkeypatch):
    monkeypatch.setenv(cli.LOG_LEVEL_ENV, "")  # recorded, so what main() exports is undone after the test
    monkeypatch.delenv(cli.LOG_LEVEL_ENV)


def test_every_command_takes_log_level():
    parser = cli._parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert len(commands) >= 13 and "init" in commands
    lacking = [name for name, sub in commands.items() if "--log-level LEVEL" not in sub.format_help()]
    assert lacking == []


@pytest.mark.parametrize("argv", [["check", "--log-level", "debug"], ["--log-level", "DEBUG", "check"],
                                  ["check", "steps=3", "--log-level", "Debug"]])
def test_the_flag_is_taken_before_or_after_the_command_and_handed_on(argv, capsys):
    assert cli.main(argv) == 0
    assert os.environ[cli.LOG_LEVEL_ENV] == "DEBUG"  # what the processes `streamrl run` starts inherit


def test_the_flag_wins_over_the_environment(monkeypatch, capsys):
    monkeypatch.setenv(cli.LOG_LEVEL_ENV, "error")
    assert cli.main(["check", "--log-level", "warning"]) == 0
    assert os.environ[cli.LOG_LEVEL_ENV] == "WARNING"


def test_a_bad_level_is_refused_with_what_is_allowed(monkeypatch, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["check", "--log-level", "loud"])
    assert e.value.code == 2 and "invalid choice: 'LOUD'" in capsys.readouterr().err
    monkeypatch.setenv(cli.LOG_LEVEL_ENV, "loud")
    assert cli.main(["check"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("streamrl: error: STREAMRL_LOG_LEVEL='loud': not a log level; "
                   "allowed: DEBUG, INFO, WARNING, ERROR, CRITICAL")


def _check(*args: str, env: dict | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != cli.LOG_LEVEL_ENV} | (env or {})
    proc = subprocess.run([sys.executable, "-m", "streamrl", "check", *args], capture_output=True, text=True,
                          env=env, timeout=120, check=True)
    return proc.stderr


def test_debug_logs_which_config_file_was_read_and_the_default_does_not():
    assert "check DEBUG config: reading " in _check("mgrpo/tiny.yaml", "--log-level", "debug")
    assert "mgrpo/tiny.yaml" in _check("mgrpo/tiny.yaml", env={cli.LOG_LEVEL_ENV: "DEBUG"})
    assert "DEBUG" not in _check("mgrpo/tiny.yaml")
