"""pyproject.toml installs every package folder, the processes under the streamrl namespace, every file the code
reads at run time (the recipes and the monitoring bundle, as data packages), LICENSE and py.typed; and every
third-party module the code imports is declared."""

from __future__ import annotations

import ast
import functools
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

from streamrl import resources

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO = Path(__file__).resolve().parents[3]
DATA_PACKAGES = {"streamrl.configs": "configs", "streamrl.monitoring": "monitoring"}
# Import names whose distribution is named otherwise, for engines this venv may not have installed.
# Import names whose distribution differs, for when it is not installed here (the mlflow extra is the skinny client).
DISTRIBUTION_OF = {"zmq": "pyzmq", "yaml": "pyyaml", "mlflow": "mlflow-skinny", "openenv": "openenv-core"}


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _setuptools() -> dict:
    return _project()["tool"]["setuptools"]


def test_every_package_folder_is_installed_and_the_processes_sit_under_streamrl():
    dirs = _setuptools()["package-dir"]
    assert dirs == {"streamrl.actors": "actors", "streamrl.learner": "learner", **DATA_PACKAGES}
    found = set()
    for name, folder in {"streamrl": "streamrl", **dirs}.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder).parts
            if name == "streamrl" and rel and rel[0] in ("actors", "learner"):
                continue
            found.add(".".join((name, *rel)))
    assert set(_setuptools()["packages"]) == found
    assert not any(p.split(".")[0] in ("actors", "learner") for p in _setuptools()["packages"])


@pytest.mark.parametrize("package,folder", sorted(DATA_PACKAGES.items()))
def test_the_package_data_patterns_cover_every_file_the_code_reads(package, folder):
    """A recipe or dashboard added to the folder but not to the patterns would be missing from the wheel."""
    root = REPO / folder
    patterns = _setuptools()["package-data"][package]
    shipped = {p.relative_to(root) for pattern in patterns for p in root.glob(pattern) if p.is_file()}
    modules = {p for p in resources.data_files(root) if p.suffix == ".py" and len(p.parts) == 1}  # built as modules
    assert set(resources.data_files(root)) - modules == shipped
    assert all(root.glob(pattern) for pattern in patterns), "a pattern that matches nothing"


def test_the_data_packages_resolve_to_the_folders_at_the_top():
    assert resources.recipes_dir().resolve() == (REPO / "configs").resolve()
    assert resources.monitoring_dir().resolve() == (REPO / "monitoring").resolve()


def test_license_and_py_typed_exist_and_ship():
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    assert _project()["project"]["license"] == "Apache-2.0"
    assert _project()["project"]["license-files"] == ["LICENSE"]
    assert (REPO / "streamrl" / "py.typed").is_file()
    assert "py.typed" in _setuptools()["package-data"]["streamrl"]


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group()).lower()


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """Top-level names of the absolute imports in `path`: (those run at module import, all of them)."""
    tree = ast.parse(path.read_text())
    every = {n.name if isinstance(n, ast.alias) else n for node in ast.walk(tree)
             for n in (node.names if isinstance(node, ast.Import) else
                       [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])}
    at_import = set()

    def visit(stmts):
        for node in stmts:
            if isinstance(node, ast.Import):
                at_import.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                at_import.add(node.module)
            elif isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + [s for h in node.handlers for s in h.body] + node.orelse + node.finalbody)
            elif isinstance(node, (ast.With, ast.ClassDef)):
                visit(node.body)

    visit(tree.body)
    root = lambda names: {m.split(".")[0] for m in names}
    return root(at_import), root(every)


@functools.cache
def _packages_distributions() -> dict:
    return metadata.packages_distributions()  # reads every installed distribution's file list: once, not per import


def _distribution(module: str) -> str:
    if module in DISTRIBUTION_OF:
        return DISTRIBUTION_OF[module]
    return (_packages_distributions().get(module) or [module])[0]


def test_every_third_party_import_is_declared():
    """Imported when a module is imported: a dependency. Imported inside a function: a dependency or an extra."""
    project = _project()["project"]
    core = {_name(r) for r in project["dependencies"]}
    extras = {_name(r) for reqs in project["optional-dependencies"].values() for r in reqs}
    undeclared = {}
    for folder in ("streamrl", "actors", "learner", "monitoring"):
        for path in (REPO / folder).rglob("*.py"):
            at_import, every = _imports(path)
            for module in every - set(sys.stdlib_module_names) - {"streamrl", "dashboard"}:
                dist = _name(_distribution(module))
                allowed = core if module in at_import else core | extras
                if dist not in allowed:
                    undeclared.setdefault(str(path.relative_to(REPO)), []).append(f"{module} ({dist})")
    assert undeclared == {}


def test_the_import_scan_tells_module_level_from_function_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import zmq\ntry:\n    import yaml.x\nexcept ImportError:\n    pass\n"
                 "def g():\n    from vllm import LLM\n")
    assert _imports(f) == ({"zmq", "yaml"}, {"zmq", "yaml", "vllm"})
    assert _distribution("zmq") == "pyzmq"
