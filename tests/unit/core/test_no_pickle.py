"""Nothing that crosses a socket is ever unpickled: the code has no way to do it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SOURCES = sorted(p for d in ("streamrl", "actors", "learner") for p in (ROOT / d).rglob("*.py"))
FORBIDDEN = {
    r"\bimport\s+(c?pickle|dill|cloudpickle|marshal|shelve)\b": "a pickle-family module",
    r"\bfrom\s+(c?pickle|dill|cloudpickle|marshal|shelve)\b": "a pickle-family module",
    r"\brecv_pyobj\b|\brecv_serialized\b|\bsend_pyobj\b": "pyzmq's pickling send/recv",
    r"\btorch\.load\(": "torch.load (unpickles unless weights_only)",
    r"allow_pickle\s*=\s*True": "numpy with allow_pickle",
    r"(?<![\w.])(eval|exec)\(": "eval/exec",
}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_source_file_can_unpickle_or_eval(path):
    text = path.read_text()
    found = [(what, text[:m.start()].count("\n") + 1) for pattern, what in FORBIDDEN.items()
             for m in re.finditer(pattern, text)]
    assert not found, f"{path.relative_to(ROOT)}: " + ", ".join(f"{w} at line {n}" for w, n in found)


def test_the_scan_catches_what_it_forbids(tmp_path):
    for snippet in ("import pickle", "obj = sock.recv_pyobj()", "torch.load(f)", "np.load(f, allow_pickle=True)",
                    "eval(s)"):
        assert any(re.search(p, snippet) for p in FORBIDDEN), snippet
    assert not any(re.search(p, "self.engine.eval()") for p in FORBIDDEN)
