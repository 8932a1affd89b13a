"""The `streamrl` command: its docstring lists every command; overrides may follow options."""

from __future__ import annotations

import re

import pytest

from streamrl.commands import cli


def test_the_module_docstring_lists_every_command():
    commands = set(cli._parser()._subparsers._group_actions[0].choices)
    listed = set(re.findall(r"^\s+streamrl (\w+)", cli.__doc__, re.M))
    assert commands == listed


def test_the_command_table_names_every_command_in_help_order():
    """`cli.main` runs a command through COMMANDS: a parser added without a row would parse and then fail."""
    assert list(cli._parser()._subparsers._group_actions[0].choices) == list(cli.COMMANDS)


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


def test_keys_refuse_to_replace_existing_keys_without_force_and_force_drops_stale_actors(tmp_path, capsys):
    keys = tmp_path / "keys"
    assert cli.main(["keys", str(keys), "--actors", "3"]) == 0
    learner_secret = (keys / "learner.key_secret").read_bytes()
    assert cli.main(["keys", str(keys), "--actors", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds keys" in err[0] and "--force" in err[0]
    assert (keys / "learner.key_secret").read_bytes() == learner_secret  # untouched
    assert cli.main(["keys", str(keys), "--actors", "1", "--force"]) == 0
    assert (keys / "learner.key_secret").read_bytes() != learner_secret
    assert sorted(p.name for p in (keys / "authorized").iterdir()) == ["actor-0.key"]  # actor-1, -2 no longer admitted
    assert not (keys / "actor-2.key_secret").exists()


def test_keys_refuse_a_negative_actor_count(tmp_path, capsys):
    assert cli.main(["keys", str(tmp_path / "keys"), "--actors", "-1"]) == 2
    assert "--actors -1" in capsys.readouterr().err and not (tmp_path / "keys").exists()


def test_plot_refuses_a_window_of_zero(tmp_path, capsys):
    assert cli.main(["plot", str(tmp_path), "--window", "0"]) == 2
    assert "--window 0: must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["eval", "uplift"])
def test_a_truncated_policy_file_is_one_line_that_names_it(tmp_path, capsys, command):
    from streamrl import config
    from streamrl.learner import checkpoints
    from streamrl.models import model as model_lib

    cfg = config.load(None, ["model.hidden_size=16", "model.intermediate_size=16"])
    (tmp_path / "config.yaml").write_text(config.dump(cfg))
    model, _ = model_lib.build(cfg)

    def write_model(directory, tag):
        (tmp_path / "checkpoints" / tag).mkdir(parents=True, exist_ok=True)

    checkpoints.save(tmp_path / "checkpoints", "step-1", write_model, {"step": 1, "version": 1}, model.state_dict())
    policy = tmp_path / "checkpoints" / "step-1" / checkpoints.POLICY
    policy.write_bytes(policy.read_bytes()[:1000])
    assert cli.main([command, str(tmp_path), "eval.prompts=2", "eval.samples=2", "eval.ks=[1]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{policy}: truncated" in err[0], err
