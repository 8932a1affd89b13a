"""`streamrl check` runs what the run will run (issue 48 item 3): a reward that can score nothing is refused, and an
episodic task's first rows are played end to end, each failure named by row (file and line), function and reason."""

from __future__ import annotations

from pathlib import Path

from streamrl.commands import cli

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
FREE = ["transport.group_port=0", "transport.weights_port=0", "transport.weights_request_port=0",
        "monitoring.learner_port=0", "monitoring.actor_port=0"]


def _check(capsys, *args) -> tuple[int, str]:
    capsys.readouterr()
    rc = cli.main(["check", *args, *FREE])
    return rc, capsys.readouterr().err


def test_a_reward_that_could_score_nothing_fails_the_check(tmp_path, capsys):
    # It printed [None, None] and exited 0 (issue 48): the run then hung waiting for its first step.
    (tmp_path / "never.py").write_text("def never(prompts, completions, **kw):\n    return [None] * len(completions)\n")
    (tmp_path / "rows.jsonl").write_text('{"prompt": "say a", "answer": "a"}\n')
    rc, err = _check(capsys, "task.name=dataset", f"task.data={tmp_path / 'rows.jsonl'}", "task.reward_levels=[0,1]",
                     f"task.reward={tmp_path / 'never.py'}:never", "advantage.r_min_correct=1", f"run_dir={tmp_path}")
    assert rc == 2 and "returned [None, None]: could not score" in err and "failed on every row tried" in err, err


def test_an_agents_rows_are_played_and_a_row_lacking_its_column_is_named_by_line(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "copy : a b a b =", "target": "a b a b"}\n{"prompt": "copy : b b a a ="}\n')
    rc, err = _check(capsys, str(EXAMPLES / "copy-agent" / "config.yaml"), f"task.data={rows}",
                     f"task.agent={EXAMPLES / 'copy-agent' / 'agent.py'}:copy_agent", f"run_dir={tmp_path}")
    assert rc == 0, err
    assert f"row 1 ({rows}:1) played: 2 episodes" in err, err
    assert f"row 2 ({rows}:2) failed: {{'bad_data': 2}} — bad data: missing column 'target'" in err, err


def test_an_environment_failing_on_every_row_fails_the_check_naming_it_and_its_error(tmp_path, capsys):
    (tmp_path / "env.py").write_text(
        "from streamrl.tasks.lookup import LookupEnv\n\n"
        "class Broken(LookupEnv):\n"
        "    def step(self, reply):\n"
        "        raise ValueError('no state for ' + reply.split()[0])\n")
    rc, err = _check(capsys, "tiny-tools.yaml", f"task.environment={tmp_path / 'env.py'}:Broken",
                     f"run_dir={tmp_path}")
    assert rc == 2 and "failed: {'step_raised': 2}" in err and "ValueError: no state for" in err, err
    assert "no row of the 3 tried played cleanly" in err, err


def test_options_whose_zero_means_two_things_are_explained(tmp_path, capsys):
    rc, err = _check(capsys, "tiny.yaml", f"run_dir={tmp_path}")
    assert rc == 0, err
    assert "transport.group_port=0: any free port" in err and "monitoring.learner_port=0: no metrics server" in err
