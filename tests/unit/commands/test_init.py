"""`streamrl init DIR` copies the shipped recipes, Slurm scripts and monitoring bundle into a project folder, and
never replaces a file there unless asked."""

from __future__ import annotations

import os
from pathlib import Path

from streamrl import config, resources
from streamrl.commands import cli

REPO = Path(__file__).resolve().parents[3]


def test_init_copies_every_recipe_script_and_monitoring_file(tmp_path, capsys):
    project = tmp_path / "project"
    assert cli.main(["init", str(project)]) == 0
    assert "wrote" in capsys.readouterr().out
    for folder, root in (("configs", resources.recipes_dir()), ("monitoring", resources.monitoring_dir())):
        copied = resources.data_files(project / folder)
        assert copied == resources.data_files(root) and copied
        assert all((project / folder / p).read_bytes() == (root / p).read_bytes() for p in copied)
    assert not (project / "configs" / "__init__.py").exists()
    assert os.access(project / "configs" / "cluster" / "submit.sh", os.X_OK)
    assert os.access(project / "configs" / "cluster" / "learner.sbatch", os.X_OK)
    assert config.load(project / "configs" / "paper" / "corpo.yaml") == config.load("paper/corpo.yaml")


def test_init_refuses_to_overwrite_and_writes_nothing_then(tmp_path, capsys):
    mine = tmp_path / "configs" / "tiny.yaml"
    mine.parent.mkdir()
    mine.write_text("name: mine\n")
    assert cli.main(["init", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "already exist" in err and str(mine) in err and "--force" in err
    assert mine.read_text() == "name: mine\n"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["configs", "tiny.yaml"]


def test_init_force_replaces_the_files_it_ships_and_keeps_the_users_others(tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "tiny.yaml").write_text("name: mine\n")
    (tmp_path / "configs" / "own.yaml").write_text("name: own\n")
    assert cli.main(["init", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "configs" / "tiny.yaml").read_text() == (resources.recipes_dir() / "tiny.yaml").read_text()
    assert (tmp_path / "configs" / "own.yaml").read_text() == "name: own\n"


def test_init_refuses_a_folder_where_it_writes_a_file(tmp_path, capsys):
    (tmp_path / "monitoring" / "compose.yml").mkdir(parents=True)
    assert cli.main(["init", str(tmp_path), "--force"]) == 2
    assert "a folder where streamrl init writes a file" in capsys.readouterr().err
    assert not (tmp_path / "configs").exists()
