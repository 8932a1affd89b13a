"""The `streamrl` command: its docstring lists every command; overrides may follow options."""

from __future__ import annotations

import re

import pytest

from streamrl.commands import cli


def test_the_module_docstring_lists_every_command():
    commands = set(cli._parser()._subparsers._group_actions[0].choices)
    listed = set(re.findall(r"^\s+streamrl (\w+)", cli.__doc__, re.M))
    assert commands == listed


def test_tool_commands_refuse_bad_arguments_with_one_line_and_status_2(tmp_path, capsys):
    assert cli.main(["eval", str(tmp_path)]) == 2
    assert cli.main(["eval"]) == 2
    assert cli.main(["uplift", str(tmp_path), "--buckets", "0"]) == 2
    assert cli.main(["eval", "--live", "--watch", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and "not a run directory" in err[0] and "--buckets 0" in err[2] and "--watch 0" in err[3]


def test_an_unknown_option_is_still_refused():
    with pytest.raises(SystemExit):
        cli.main(["check", "steps=3", "--bogus"])
