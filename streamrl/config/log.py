"""The `log` section: what the run directory keeps of what the model wrote."""

from __future__ import annotations

from streamrl.config.base import NonNegInt, PositiveFloat, PositiveInt, _Section


class LogConfig(_Section):
    samples_every: NonNegInt = 10
    """Every this many steps the learner writes samples of the batch to the run's samples.jsonl (0: never)."""
    samples_per_log: PositiveInt = 8
    """Most samples written each time: whole groups, first in the batch first (a group's advantages side by side)."""
    samples_max_chars: PositiveInt = 4000
    """Longest prompt or completion text a sample's record keeps: a longer one keeps its start and end around a
    marker "…[truncated, N chars]…", and the record its full length (`truncated`: {field: chars})."""
    samples_max_mb: PositiveFloat = 64.0
    """samples.jsonl is rotated to samples.<n>.jsonl (1, 2, ...; never renamed again) before it grows past this."""
    samples_max_files: PositiveInt = 16
    """Most parts of the samples log kept, samples.jsonl included; past them later samples are not written (said
    once): a run's record is never deleted or overwritten."""
