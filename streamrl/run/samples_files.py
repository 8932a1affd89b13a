"""Where a run's samples log lies: samples.jsonl and the parts rotated out of it, oldest first.

The learner (streamrl.learner.samples) appends to `samples.jsonl`; once another step's records would take it past
`log.samples_max_mb` it is renamed to the next free `samples.<n>.jsonl` (1, 2, ...: a part is never renamed
again, so no record is overwritten) and a new samples.jsonl begun. At most `log.samples_max_files` parts are kept
in all, samples.jsonl included: past that the learner stops writing samples (said once) rather than delete the
oldest, as a run's record is never truncated. `streamrl samples` reads every part, in this order.
"""

from __future__ import annotations

import re
from pathlib import Path

FILE = "samples.jsonl"
_PART = re.compile(r"samples\.(\d+)\.jsonl")


def parts(run_dir: Path) -> list[Path]:
    """Every part of the samples log in `run_dir`, oldest first: samples.1.jsonl, samples.2.jsonl, ...,
    samples.jsonl (files moved aside by a resume, `*.before-resume-*`, are not parts)."""
    run_dir = Path(run_dir)
    numbered = sorted((int(m.group(1)), p) for p in run_dir.glob("samples.*.jsonl") if (m := _PART.fullmatch(p.name)))
    current = run_dir / FILE
    return [p for _, p in numbered] + ([current] if current.exists() else [])


def next_part(run_dir: Path) -> Path:
    """The name the current samples.jsonl is rotated to: one past the highest part number there is."""
    numbered = [int(m.group(1)) for p in Path(run_dir).glob("samples.*.jsonl") if (m := _PART.fullmatch(p.name))]
    return Path(run_dir) / f"samples.{max(numbered, default=0) + 1}.jsonl"
