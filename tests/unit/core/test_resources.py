"""Recipes are found by the name a user types: their own file first, else the one shipped inside the package
(streamrl.resources), from any working directory; a name that is neither is one error that lists the shipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrl import config, resources
from streamrl.commands import cli

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def elsewhere(tmp_path, monkeypatch) -> Path:
    """An empty working directory, away from the checkout."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("name", ["tiny.yaml", "paper/corpo.yaml", "configs/paper/corpo.yaml", "cluster/async-8b.yaml"])
def test_a_shipped_recipe_is_found_by_name_from_any_directory(elsewhere, name):
    found = resources.recipe(name)
    assert found == resources.recipes_dir() / name.removeprefix("configs/")
    assert found.read_text() == (REPO / "configs" / name.removeprefix("configs/")).read_text()


def test_a_shipped_recipe_loads_with_what_it_extends(elsewhere):
    cfg = config.load("paper/corpo.yaml")
    assert cfg == config.load(REPO / "configs" / "paper" / "corpo.yaml")
    assert cfg.advantage.estimator == "corpo"


def test_the_users_own_file_wins_over_a_shipped_one_of_the_same_name(elsewhere):
    (elsewhere / "tiny.yaml").write_text("name: mine\nsteps: 3\n")
    assert resources.recipe("tiny.yaml") == Path("tiny.yaml")
    cfg = config.load("tiny.yaml")
    assert (cfg.name, cfg.steps) == ("mine", 3)


def test_a_users_file_may_extend_a_shipped_recipe_by_name(elsewhere):
    (elsewhere / "mine.yaml").write_text("extends: paper/grpo.yaml\nname: my-grpo\n")
    cfg = config.load("mine.yaml")
    shipped = config.load("paper/grpo.yaml")
    assert cfg.name == "my-grpo" and cfg.advantage == shipped.advantage and cfg.model == shipped.model


def test_a_missing_name_is_one_error_that_lists_the_shipped_recipes(elsewhere):
    with pytest.raises(config.ConfigError) as e:
        config.load("paper/corpo-typo.yaml")
    msg = str(e.value)
    assert msg.startswith("config file 'paper/corpo-typo.yaml' not found") and "\n" not in msg
    for name in ("tiny.yaml", "tiny-strict.yaml", "paper/corpo.yaml", "mgrpo/tiny.yaml"):
        assert name in msg
    assert set(resources.recipe_names()) >= {"tiny.yaml", "paper/corpo.yaml", "cluster/async-8b.yaml"}
    assert "__init__.py" not in msg


@pytest.mark.parametrize("name", ["../configs/tiny.yaml", "/tiny.yaml", "configs"])
def test_names_outside_the_shipped_folder_are_never_looked_up_there(elsewhere, name):
    assert resources.shipped_recipe(name) is None
    with pytest.raises(resources.RecipeNotFound):
        resources.recipe(name)


def test_the_cli_checks_a_shipped_recipe_by_name(elsewhere, capsys):
    assert cli.main(["check", "mgrpo/tiny.yaml"]) == 0
    assert capsys.readouterr().out.startswith("name: ")
    assert cli.main(["check", "no-such.yaml"]) == 2
    err = capsys.readouterr().err
    assert "(shipped: " in err and all(f" {name}," in err for name in ("tiny-strict.yaml", "tiny.yaml"))


def test_plan_finds_the_shipped_model_shape_from_any_directory(elsewhere, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli.main(["plan", "model.path=Qwen/Qwen3-8B"]) == 0
    out = capsys.readouterr().out
    assert str(resources.model_shapes_dir() / "Qwen3-8B" / "config.json") in out and "8.191 B parameters" in out


def test_the_monitoring_bundle_is_shipped():
    names = {p.as_posix() for p in resources.data_files(resources.monitoring_dir())}
    assert {"compose.yml", "prometheus.yml", "alerts.yml", "grafana/dashboards/streamrl.json"} <= names


def test_the_dashboard_hint_names_a_compose_file_that_exists(elsewhere):
    from streamrl.commands import launch

    assert launch._compose_file() == str(resources.monitoring_dir() / "compose.yml")
    assert Path(launch._compose_file()).is_file()
    assert cli.main(["init", str(elsewhere)]) == 0  # a project folder: its own copy, which the user may edit
    assert launch._compose_file() == "monitoring/compose.yml"
