"""No code decides what to do by comparing a plug-in's name to a string literal (`backend == "hf"`, `task.name in
("agent", "verifiers")`): what a plug-in can do is a capability it declares, asked through the registry
(streamrl/registry.py, the one place that knows names). The walk reads every module of the shared core and
both processes."""

from __future__ import annotations

import ast
from pathlib import Path

from streamrl import registry

REPO = Path(__file__).resolve().parents[3]
ROOTS = ("streamrl", "actors", "learner")
ALLOWED = {Path("streamrl/registry.py")}  # the registry itself
COMPARE = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def plugin_names() -> set[str]:
    return {name for reg in registry.KINDS.values() for name in reg.names()}


def _literals(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [v for elt in node.elts for v in _literals(elt)]
    return []


def name_comparisons(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, literal) for each comparison (==, !=, in, not in, a match case) against a plug-in's name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(op, COMPARE) for op in node.ops):
            for side in (node.left, *node.comparators):
                found += [(node.lineno, lit) for lit in _literals(side) if lit in names]
        elif isinstance(node, ast.MatchValue):
            found += [(node.lineno, lit) for lit in _literals(node.value) if lit in names]
    return found


def test_the_walk_finds_a_name_comparison_in_every_form_it_looks_for():
    names = {"hf", "agent", "wandb"}
    source = ('a = cfg.backend == "hf"\nb = name in ("agent", "x")\nc = "wandb" not in names\n'
              'match k:\n    case "hf":\n        pass\nd = {"hf": 1}["hf"]\ne = p.name == "checkpoints"\n')
    assert name_comparisons(source, names) == [(1, "hf"), (2, "agent"), (3, "wandb"), (5, "hf")]


def test_no_code_outside_the_registry_compares_a_plug_ins_name_to_a_string():
    names = plugin_names()
    assert {"hf", "vllm", "dataset", "verifiers", "token_pg", "corpo", "wandb"} <= names  # every kind was read
    found = {}
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            rel = path.relative_to(REPO)
            if rel not in ALLOWED and (hits := name_comparisons(path.read_text(), names)):
                found[str(rel)] = hits
    assert found == {}, f"compare a capability (streamrl.registry.CAPABILITIES), not a name: {found}"
