"""docs/reference/environment.md lists every environment variable the code reads: the Python of streamrl/, actors/ and
learner/ (os.environ and os.getenv, by literal name, by a module constant, or by a loop over literal names) and
the `${NAME:-default}` reads of the Slurm scripts."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PAGE = REPO / "docs" / "reference" / "environment.md"
ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]+")


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) \
        and node.value.id == "os"


def _constants(tree: ast.AST) -> dict[str, str]:
    """Module-level `NAME = "TEXT"` assignments."""
    return {t.id: node.value.value for node in getattr(tree, "body", []) if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for t in node.targets if isinstance(t, ast.Name)}


def _loop_values(tree: ast.AST) -> dict[str, list[str]]:
    """Loop variables that run over a literal tuple or list of strings (`for k in ("A", "B")`)."""
    found: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        for target, it in ([(node.target, node.iter)] if isinstance(node, (ast.For, ast.comprehension)) else []):
            if isinstance(target, ast.Name) and isinstance(it, (ast.Tuple, ast.List)):
                found[target.id] = [e.value for e in it.elts if isinstance(e, ast.Constant)]
    return found


def names_read(source: str, known: dict[str, str]) -> set[str]:
    """Environment variables `source` reads or sets through os.environ / os.getenv. `known`: constants of other
    modules by name (an imported SPAWNED_AT)."""
    tree = ast.parse(source)
    consts, loops = {**known, **_constants(tree)}, _loop_values(tree)

    def values(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.Name):
            return [consts[node.id]] if node.id in consts else loops.get(node.id, [])
        if isinstance(node, ast.Attribute):  # forked.ENV, startup.SPAWNED_AT
            return [consts[node.attr]] if node.attr in consts else []
        return []

    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if (_is_environ(f.value) and f.attr in ("get", "setdefault", "pop")) or \
                    (f.attr == "getenv" and isinstance(f.value, ast.Name) and f.value.id == "os"):
                found.update(v for a in node.args[:1] for v in values(a))
            if _is_environ(f.value) and f.attr == "update":
                found.update(k.arg for k in node.keywords if k.arg)
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            found.update(values(node.slice))
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            found.update(values(node.left))
        elif isinstance(node, ast.Dict) and any(k is None and _is_environ(v) for k, v in zip(node.keys, node.values)):
            found.update(v for k in node.keys if k is not None for v in values(k))  # {**os.environ, NAME: ...}
    return {n for n in found if ENV_NAME.fullmatch(n)}


def _python_files() -> list[Path]:
    return [p for folder in ("streamrl", "actors", "learner") for p in (REPO / folder).rglob("*.py")]


def code_names() -> set[str]:
    files = _python_files()
    known = {k: v for p in files for k, v in _constants(ast.parse(p.read_text())).items()}
    return {n for p in files for n in names_read(p.read_text(), known)}


def script_names() -> set[str]:
    return {m for p in (REPO / "configs" / "cluster").iterdir() if p.suffix in (".sh", ".sbatch")
            for m in re.findall(r"\$\{([A-Z][A-Z0-9_]+):-", p.read_text())}


def listed() -> set[str]:
    return set(re.findall(r"`([A-Z][A-Z0-9_]+)`", PAGE.read_text()))


def test_every_variable_the_code_reads_is_on_the_page():
    assert code_names() - listed() == set()


def test_every_variable_the_slurm_scripts_read_with_a_default_is_on_the_page():
    assert script_names() - listed() == set()


def test_the_page_lists_no_variable_nothing_reads():
    """A variable the code stopped reading goes from the page too (aside: libraries' own, values named in prose)."""
    prose = {"TORCH_EXTENSIONS_DIR", "HF_HOME", "PASSIVE", "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}
    assert listed() - code_names() - script_names() - prose == set()


def test_the_scan_finds_each_way_the_code_reads_a_variable():
    source = '''
import os
from x import SPAWNED_AT
ENV = "A_FORK"
os.environ.get(ENV, "1")
os.getenv("B_GET")
os.environ["C_ITEM"]
"D_IN" in os.environ
os.environ.update(E_UPDATE="1")
any(os.environ.get(k) for k in ("F_LOOP", "G_LOOP"))
{**os.environ, SPAWNED_AT: "1"}
os.environ.setdefault("H_DEFAULT", "0")
"path" in other
'''
    assert names_read(source, {"SPAWNED_AT": "I_IMPORTED"}) == {
        "A_FORK", "B_GET", "C_ITEM", "D_IN", "E_UPDATE", "F_LOOP", "G_LOOP", "H_DEFAULT", "I_IMPORTED"}
    assert {"STREAMRL_FORK", "STREAMRL_LOG_LEVEL", "STREAMRL_SPAWNED_AT", "HF_HUB_OFFLINE", "RANK",
            "MASTER_PORT"} <= code_names()
