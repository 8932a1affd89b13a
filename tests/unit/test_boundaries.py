"""Import boundaries (docs/architecture.md, "Processes"): actors/ and learner/ never import each other; streamrl/ never
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


def _project_modules() -> dict[str, Path]:
    mods = {}
    for package in ("streamrl", "actors", "learner"):
        for p in _py_files(package):
            name = ".".join(p.relative_to(REPO).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = p
    return mods


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module → the project modules it imports anywhere (function bodies too: a deferred import is still a
    dependency a reader has to follow). `from a import b` points at `a.b` when that is a module, else at `a`."""
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    deps.add(full if full in mods else node.module)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle_through_a_deferred_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_the_projects_modules():
    mods = _project_modules()
    graph = import_graph(mods)
    assert graph["actors.main"], "the import graph sees nothing: the scanner is broken"
    assert cycles(graph) == []
