"""The order-sensitive checksum of a weight bucket that the collective sync's receivers verify before loading: a torn
or misplaced bucket changes it, and the same bytes give the same sum on any device (up to its reduction order)."""

from __future__ import annotations

import torch

_PERIOD = 1009
_SLICE = _PERIOD * 1024  # elements per pass: a multiple of the period, so every slice has the same weights
_WEIGHTS: dict[torch.device, torch.Tensor] = {}


def _weights(device: torch.device) -> torch.Tensor:
    """(_SLICE,) float64 position weights 1 + (i + 1) mod 1009, made once per device (8 MiB)."""
    if device not in _WEIGHTS:
        _WEIGHTS[device] = torch.arange(1, _SLICE + 1, dtype=torch.float64, device=device).remainder_(_PERIOD).add_(1)
    return _WEIGHTS[device]


def checksum(flat: torch.Tensor) -> float:
    """Order-sensitive float64 checksum of a bucket (n,): Σ x_i · (1 + (i + 1) mod 1009); a torn or misplaced
    bucket changes it. Taken a slice at a time, so it needs 16 MiB beyond the bucket, not a float64 copy, a
    float64 weight vector and their product (24 B per element: 1.5 GiB for a 256 MiB float32 bucket)."""
    w = _weights(flat.device)
    total = torch.zeros((), dtype=torch.float64, device=flat.device)
    for a in range(0, flat.numel(), _SLICE):
        x = flat[a:a + _SLICE].double()
        total += torch.dot(x, w[:x.numel()])
    return float(total)
