"""Import boundaries (docs/concepts/architecture.md, "Processes"): the shared core is layered by role; actors/ and learner/
(installed as streamrl.actors and streamrl.learner) import only from it, never each other; streamrl/ never imports
an inference engine or DeepSpeed when a module is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
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


# Where each module's file lies: the processes' folders sit at the top of the repository and install as
# streamrl.actors and streamrl.learner (pyproject.toml's package-dir).
FOLDERS = {"streamrl": "streamrl", "streamrl.actors": "actors", "streamrl.learner": "learner"}


def _py_files(package: str) -> list[Path]:
    files = sorted((REPO / package).rglob("*.py"))
    assert files, f"no Python files under {package}/"
    return files


def _part(module: str) -> str | None:
    """The part of the shared core (or the process) a `streamrl.…` module belongs to: `streamrl.comm.wire` → comm,
    `streamrl.config` → config, `streamrl.actors.main` → actors; None outside streamrl."""
    parts = module.split(".")
    if parts[0] != "streamrl":
        return None
    return parts[1] if len(parts) > 1 else "streamrl"


def _part_of_file(path: Path) -> str:
    rel = path.relative_to(REPO).parts
    if rel[0] in ("actors", "learner"):
        return rel[0]
    return rel[1] if len(rel) > 2 else rel[1].removesuffix(".py")


def _imported_parts(path: Path) -> set[str]:
    """The parts a file imports anywhere; `from streamrl import config` counts as importing `config`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = _imported_modules(node)
        if isinstance(node, ast.ImportFrom) and node.module == "streamrl":
            names = [f"streamrl.{a.name}" for a in node.names]
        found |= {p for m in names if (p := _part(m))}
    return found


# The layers of the shared core, bottom up: a part may import the parts listed against it and nothing else of
# streamrl. The processes, the commands and the benches sit on top (checked below).
LAYERS = {
    "registry": set(),                                      # name → plug-in registries, every kind's
    "resources": set(),                                     # the shipped recipes and monitoring bundle
    "comm": set(),                                          # wire messages, sockets, weight chunks, CurveZMQ
    "ordinal": set(),                                       # the ordinal reward scale: buckets, shaped levels
    "config": {"ordinal", "registry", "resources"},         # the typed config (plug-ins reached through the registry)
    "algo": {"config", "registry"},                         # advantages, losses, staleness, filters, signal
    "tasks": {"config", "ordinal", "registry"},             # prompts, answers, rewards and their shaping
    "telemetry": {"algo", "comm", "registry"},              # Prometheus, health, start-up phases, trackers
    "models": {"algo", "config", "tasks"},                  # model and tokenizer builders, sampling, prompts
    "run": {"config", "models", "telemetry"},               # preflight, storage, checkpoints, logging, placement
    "evaluation": {"algo", "config", "models", "tasks"},    # pass@k on the eval set
}
SHARED = set(LAYERS)
# On top of everything: they may import the shared core and both processes (a bench drives the learner's and the
# actors' own code, and `streamrl bench` launches runs through the commands).
ON_TOP = {"commands", "bench"}


def test_every_part_of_the_shared_core_has_a_layer():
    parts = {p.name.removesuffix(".py") for p in (REPO / "streamrl").iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}
    assert parts - {"__init__", "__main__"} - ON_TOP == SHARED


@pytest.mark.parametrize("part", sorted(LAYERS))
def test_the_shared_core_imports_only_from_the_layers_below(part):
    files = [p for p in _py_files("streamrl") if _part_of_file(p) == part]
    offenders = {str(p.relative_to(REPO)): sorted(bad) for p in files
                 if (bad := _imported_parts(p) - LAYERS[part] - {part})}
    assert offenders == {}


@pytest.mark.parametrize("package,forbidden", [("actors", "learner"), ("learner", "actors")])
def test_actors_and_learner_import_only_the_shared_core(package, forbidden):
    offenders = {str(p.relative_to(REPO)): sorted(bad) for p in _py_files(package)
                 if (bad := _imported_parts(p) - SHARED - {package})}
    assert offenders == {}


def test_the_layer_scanner_sees_what_it_should():
    assert _part("streamrl.comm.wire") == "comm" and _part("streamrl.learner.batch") == "learner"
    assert _part("streamrl") == "streamrl" and _part("learner.batch") is None
    assert _part_of_file(REPO / "streamrl" / "comm" / "wire.py") == "comm"
    assert _part_of_file(REPO / "streamrl" / "config" / "loader.py") == "config"
    assert _part_of_file(REPO / "streamrl" / "registry.py") == "registry"
    assert _part_of_file(REPO / "learner" / "main.py") == "learner"
    assert _imported_parts(REPO / "learner" / "session.py") >= {"comm", "config", "learner"}


def test_nothing_imports_the_processes_top_level_names():
    """`actors` and `learner` are folders, never top-level packages: a user's own learner.py would shadow them."""
    offenders = {str(p.relative_to(REPO)): bad
                 for package in ("streamrl", "actors", "learner", "tests") for p in _py_files(package)
                 if (bad := [m for m in all_imports(p.read_text()) if _root(m) in ("actors", "learner")])}
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
        if (bad := [m for m in all_imports(p.read_text()) if _root(m) in ("tests", "fakes", "procs", "conftest")])
    }
    assert offenders == {}


def test_the_benches_import_only_the_shared_core_the_processes_and_the_commands():
    files = [p for p in _py_files("streamrl") if _part_of_file(p) == "bench"]
    assert files, "no bench under streamrl/bench/"
    offenders = {str(p.relative_to(REPO)): sorted(bad) for p in files
                 if (bad := _imported_parts(p) - SHARED - ON_TOP - {"actors", "learner"})}
    assert offenders == {}


def test_only_the_command_line_and_the_benches_import_the_commands():
    files = [p for p in [*_py_files("streamrl"), *_py_files("actors"), *_py_files("learner")]
             if _part_of_file(p) not in (*ON_TOP, "__main__")]
    offenders = {str(p.relative_to(REPO)): "commands" for p in files if "commands" in _imported_parts(p)}
    assert offenders == {}


def test_only_the_command_line_imports_the_benchmarks():
    files = [p for p in [*_py_files("streamrl"), *_py_files("actors"), *_py_files("learner")]
             if _part_of_file(p) not in ("commands", "bench")]
    offenders = {str(p.relative_to(REPO)): "bench" for p in files if "bench" in _imported_parts(p)}
    assert offenders == {}


def _project_modules() -> dict[str, Path]:
    mods = {}
    for package, folder in FOLDERS.items():
        for p in _py_files(folder):
            rel = p.relative_to(REPO / folder).with_suffix("").parts
            if package == "streamrl" and rel[0] in ("actors", "learner"):
                continue
            mods[".".join((package, *rel)).removesuffix(".__init__")] = p
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
    assert graph["streamrl.actors.main"], "the import graph sees nothing: the scanner is broken"
    assert cycles(graph) == []
