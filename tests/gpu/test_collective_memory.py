"""The weight-sync checksum on a GPU: learner rank 0 checksums every bucket it broadcasts, and must not
make float64 copies of it (24 B per element: 1.5 GiB for a 256 MiB float32 bucket, 3 GiB for bf16).
Not run yet: no GPU has been available to this project; the CPU counterpart (peak RSS) is
tests/unit/comm/test_collective_devices.py::test_the_checksum_of_a_bucket_needs_a_small_fraction_of_the_buckets_size_beyond_it."""

from __future__ import annotations

import pytest
import torch

from streamrl.comm.weights import checksums

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_checksum_of_a_256_mib_bucket_allocates_at_most_a_few_slices_on_the_gpu(dtype):
    flat = torch.randn((256 << 20) // torch.tensor([], dtype=dtype).element_size(), device="cuda").to(dtype)
    checksums.checksum(flat[:10])  # the cached position weights (8 MiB) made before measuring
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    got = checksums.checksum(flat)
    extra = torch.cuda.max_memory_allocated() - base
    assert extra < 32 << 20, f"{extra / 2**20:.0f} MiB beyond the bucket"
    assert got == pytest.approx(checksums.checksum(flat.cpu()), rel=1e-9)  # the value a CPU receiver computes
