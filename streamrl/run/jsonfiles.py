"""JSON files a run leaves behind (summary, eval, uplift, reproduce): valid JSON, written atomically."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path


def finite(v):
    """JSON has no inf/nan: an undefined ratio (e.g. r_count with no negative advantage) is null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite(x) for x in v]
    return v


def line(obj) -> str:
    """One JSON object per line (metrics.jsonl, eval.jsonl)."""
    return json.dumps(finite(obj)) + "\n"


def write(path: Path, obj) -> None:
    """Write atomically: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(finite(obj), indent=2) + "\n")
    os.replace(tmp, path)
