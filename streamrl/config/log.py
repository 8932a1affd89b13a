"""The `log` section: what the run directory keeps of what the model wrote."""

from __future__ import annotations

from streamrl.config.base import NonNegInt, PositiveFloat, PositiveInt, _Section


class LogConfig(_Section):
    samples_every: NonNegInt = 10
    """Every this many steps the learner writes samples of the batch to the run's samples.jsonl (0: never)."""
    samples_per_log: PositiveInt = 8
    """Most samples written each time: whole groups, first in the batch first (a group's advantages side by side)."""
    samples_max_chars: PositiveInt = 4000
    """Longest prompt or completion a record keeps; longer: start and end around "…[truncated, N chars]…"."""
    samples_max_mb: PositiveFloat = 64.0
    """samples.jsonl is rotated to samples.<n>.jsonl (1, 2, ...; never renamed again) before it grows past this."""
    samples_max_files: PositiveInt = 16
    """Most parts of the samples log kept, samples.jsonl included; past them no more samples are logged (said once)."""
