"""Import boundaries from DESIGN.md: actors/ and learner/ never import each other; streamrl/ never
imports an inference engine or DeepSpeed when a module is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = {"vllm", "sglang", "deepspeed"}


def _imported_modules(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    return []


def all_imports(source: str) -> list[str]:
    """Every absolute import anywhere in the file, including inside functions."""
    return [m for node in ast.walk(ast.parse(source)) for m in _imported_modules(node)]


def module_level_imports(source: str) -> list[str]:
    """Imports that run when the module is imported: top-level statements (and the bodies of top-level
    if/try/with blocks and class bodies, which also run then), not function bodies."""
    found: list[str] = []

    def visit(stmts):
        for node in stmts:
            found.extend(_imported_modules(node))
            if isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for h in node.handlers:
                    visit(h.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.With):
                visit(node.body)
            elif isinstance(node, ast.ClassDef):
                visit(node.body)

    visit(ast.parse(source).body)
    return found


def _root(module: str) -> str:
    return module.split(".")[0]


def _py_files(package: str) -> list[Path]:
    files = sorted((REPO / package).rglob("*.py"))
    assert files, f"no Python files under {package}/"
    return files


def test_the_import_scanners_see_what_they_should():
    src = ("import os\nfrom learner.batch import x\nimport deepspeed as ds\n"
           "try:\n    import vllm\nexcept ImportError:\n    pass\n"
           "if TYPE_CHECKING:\n    import sglang\n"
           "def f():\n    import learner\n    from deepspeed import zero\n"
           "from . import sibling\n")
    assert set(map(_root, all_imports(src))) == {"os", "learner", "deepspeed", "vllm", "sglang"}
    assert set(map(_root, module_level_imports(src))) == {"os", "learner", "deepspeed", "vllm"}


@pytest.mark.parametrize("package,forbidden", [("actors", "learner"), ("learner", "actors")])
def test_actors_and_learner_never_import_each_other(package, forbidden):
    offenders = {
        str(p.relative_to(REPO)): bad
        for p in _py_files(package)
        if (bad := [m for m in all_imports(p.read_text()) if _root(m) == forbidden])
    }
    assert offenders == {}


def test_streamrl_never_imports_an_engine_or_deepspeed_at_module_level():
    offenders = {
        str(p.relative_to(REPO)): bad
        for p in _py_files("streamrl")
        if (bad := [m for m in module_level_imports(p.read_text()) if _root(m) in HEAVY])
    }
    assert offenders == {}


@pytest.mark.parametrize("package", ["streamrl", "actors", "learner"])
def test_nothing_under_the_package_imports_from_tests(package):
    offenders = {
        str(p.relative_to(REPO)): bad
        for p in _py_files(package)
        if (bad := [m for m in all_imports(p.read_text()) if _root(m) in ("tests", "procs", "conftest")])
    }
    assert offenders == {}


def _core_files() -> list[Path]:
    """streamrl/ without its commands: what the processes share (`__main__` only forwards to the CLI)."""
    return [p for p in _py_files("streamrl")
            if "commands" not in p.relative_to(REPO / "streamrl").parts and p.name != "__main__.py"]


def test_the_shared_core_never_imports_a_process():
    offenders = {
        str(p.relative_to(REPO)): bad
        for p in _core_files()
        if (bad := [m for m in all_imports(p.read_text()) if _root(m) in ("actors", "learner")])
    }
    assert offenders == {}


def test_only_the_command_line_imports_the_commands():
    files = [*_core_files(), *_py_files("actors"), *_py_files("learner")]
    offenders = {
        str(p.relative_to(REPO)): bad
        for p in files
        if (bad := [m for m in all_imports(p.read_text()) if m.startswith("streamrl.commands")])
    }
    assert offenders == {}
