"""The backends package has no import cycle: backend modules take the protocol and registry from
`actors.backends.base`, and only the package's __init__ imports the backends (to register them)."""

from __future__ import annotations

import ast
from pathlib import Path

BACKENDS = Path(__file__).resolve().parents[3] / "actors" / "backends"


def _imported(path: Path) -> set[str]:
    """Modules a file imports (`from a.b import c` counts as importing a.b)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_no_backend_module_imports_the_package_that_imports_it():
    modules = [p for p in BACKENDS.glob("*.py") if p.name != "__init__.py"]
    assert {p.stem for p in modules} >= {"base", "hf", "vllm", "sglang", "vllm_worker", "shm_weights"}
    for path in modules:
        assert "streamrl.actors.backends" not in _imported(path), path.name


def test_the_package_registers_every_backend_on_import():
    import streamrl.actors.backends

    assert streamrl.actors.backends.BACKENDS.names() == ["hf", "sglang", "vllm"]
    assert streamrl.actors.backends.BACKENDS is __import__("streamrl.actors.backends.base", fromlist=["BACKENDS"]).BACKENDS
