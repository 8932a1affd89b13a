"""pyproject.toml installs every package folder, the processes under the streamrl namespace."""

from __future__ import annotations

import pytest
from pathlib import Path

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO = Path(__file__).resolve().parents[2]


def _setuptools() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_installed_and_the_processes_sit_under_streamrl():
    dirs = _setuptools()["package-dir"]
    assert dirs == {"streamrl.actors": "actors", "streamrl.learner": "learner"}
    found = set()
    for name, folder in {"streamrl": "streamrl", **dirs}.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder).parts
            if name == "streamrl" and rel and rel[0] in ("actors", "learner"):
                continue
            found.add(".".join((name, *rel)))
    assert set(_setuptools()["packages"]) == found
    assert not any(p.split(".")[0] in ("actors", "learner") for p in _setuptools()["packages"])
