"""Files streamrl reads at run time that ship inside the package: the recipes and the monitoring bundle.

The folders stay at the top of the repository (`configs/`, `monitoring/`) and install as the data packages
`streamrl.configs` and `streamrl.monitoring` (pyproject `package-dir`), so a wheel, an editable install and a
checkout all read them here, through `importlib.resources`, never through a path built from this file.
Wheels install unpacked, so the package folders are real directories: a recipe's `extends:` finds its
neighbours and `streamrl plan` can glob the shipped model shapes.

A recipe is named as a user types it: a path to a file of theirs wins; otherwise the name (`tiny.yaml`,
`paper/corpo.yaml`, or `configs/paper/corpo.yaml` as the docs write it) is looked up among the shipped ones.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

RECIPES = "streamrl.configs"
MONITORING = "streamrl.monitoring"
# What the data packages hold besides their data: never copied or listed as a recipe.
_NOT_DATA = {"__init__.py", "__pycache__"}


class RecipeNotFound(FileNotFoundError):
    """A recipe name that is neither a file nor shipped; the message lists the shipped ones."""


def _folder(package: str) -> Path:
    try:
        root = resources.files(package)
    except ModuleNotFoundError:  # an editable install made before the data packages existed
        raise RuntimeError(f"{package} is not installed; reinstall streamrl (`pip install -e .` in a checkout)"
                           ) from None
    if not isinstance(root, Path):  # a zipped install: the recipes' `extends:` needs real files
        raise RuntimeError(f"{package} is not installed as a folder ({root!r}); install streamrl unzipped")
    return root


def recipes_dir() -> Path:
    """The shipped `configs/` folder."""
    return _folder(RECIPES)


def monitoring_dir() -> Path:
    """The shipped `monitoring/` folder (Prometheus, Grafana, alert rules, compose file)."""
    return _folder(MONITORING)


def model_shapes_dir() -> Path:
    """Released models' config.json (shape only) that `streamrl plan` reads: `<name>/config.json`."""
    return recipes_dir() / "models"


def data_files(root: Path) -> list[Path]:
    """Every data file under `root`, relative to it, sorted (no package marker, no bytecode)."""
    return sorted(p.relative_to(root) for p in root.rglob("*")
                  if p.is_file() and not _NOT_DATA & set(p.relative_to(root).parts) and p.suffix != ".pyc")


def recipe_names() -> list[str]:
    """The shipped recipes, as `recipe` accepts them: `tiny.yaml`, `paper/corpo.yaml`, ..."""
    names = [p for p in data_files(recipes_dir()) if p.suffix == ".yaml"]
    return [p.as_posix() for p in sorted(names, key=lambda p: (len(p.parts), p.as_posix()))]


def shipped_recipe(name: str | Path) -> Path | None:
    """The shipped recipe called `name` (`tiny.yaml`, `paper/corpo.yaml`, `configs/paper/corpo.yaml`), or None."""
    parts = Path(name).parts
    parts = parts[1:] if parts[:1] == ("configs",) else parts
    if not parts or Path(name).is_absolute() or ".." in parts:
        return None
    shipped = recipes_dir().joinpath(*parts)
    return shipped if shipped.is_file() else None


def recipe(name: str | Path) -> Path:
    """The YAML file `name` means: the user's own file when one exists at that path, else the shipped recipe
    of that name. RecipeNotFound lists the shipped names."""
    given = Path(name).expanduser()
    if given.is_file():
        return given
    if (shipped := shipped_recipe(name)) is not None:
        return shipped
    raise RecipeNotFound(f"config file {str(name)!r} not found: no such file here, and no shipped recipe of that "
                         f"name (shipped: {', '.join(recipe_names())})")
