"""A weight version handed from the actor to its engine's workers through node-local shared memory.

The actor writes the state dict as bucket files in a folder under /dev/shm (each bucket one dtype,
at most `bucket_bytes`, cut by `streamrl.comm.weights.collective.plan`, the same plan the collective sync
uses); the workers (every tensor-parallel rank, same node) map the files one bucket at a time and
hand out tensors that are views into the mapping, so nothing is serialised, no message size limit
applies, and no tensor is copied to the device before the engine's own weight loaders copy it into
its parameters. Only names, dtypes and shapes travel in the call.

Layout of bucket i: file `bucket-<i>`, the bucket's tensors back to back in plan order, each
`numel × itemsize` bytes (one dtype per bucket, so every offset is aligned).
"""

from __future__ import annotations

import math
import mmap
import os
import shutil
import tempfile
from typing import Iterator

import torch

from streamrl.comm.weights.collective import SyncPlan

Buckets = list[list[list]]  # [[[name, dtype, shape], ...] per bucket]: what crosses to the workers (msgpack)


def shm_root() -> str:
    """/dev/shm where it exists (memory, not disk), else the temp folder."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def new_folder(prefix: str = "streamrl-weights-") -> str:
    return tempfile.mkdtemp(prefix=prefix, dir=shm_root())


def _nbytes(dtype: str, shape: list[int]) -> int:
    return math.prod(shape) * getattr(torch, dtype).itemsize


def write(state: dict[str, torch.Tensor], plan: SyncPlan, folder: str) -> Buckets:
    """Write `state` into `folder` as the plan's bucket files, each tensor's bytes written straight
    from its memory (a CPU contiguous tensor, as weights arrive, is not copied first). A bucket file of
    the right size from the last version is overwritten in place: its memory is already there.
    Returns the bucket description the workers read them with."""
    buckets: Buckets = []
    for i, specs in enumerate(plan.buckets):
        size = sum(_nbytes(s.dtype, s.shape) for s in specs)
        path = os.path.join(folder, f"bucket-{i}")
        reuse = os.path.exists(path) and os.path.getsize(path) == size
        with open(path, "r+b" if reuse else "w+b") as f:
            if not reuse:
                f.truncate(size)
                _reserve(f.fileno(), size, path)
            offset = 0
            for s in specs:
                t = state[s.name].detach()
                if t.dtype != getattr(torch, s.dtype) or list(t.shape) != s.shape:
                    raise ValueError(f"weight update: {s.name} is {t.dtype} {list(t.shape)}, the plan says "
                                     f"{s.dtype} {s.shape} (every version must have the first one's tensors)")
                _pwrite_all(f.fileno(), t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy(), offset)
                offset += _nbytes(s.dtype, s.shape)
        buckets.append([[s.name, s.dtype, list(s.shape)] for s in specs])
    return buckets


def _pwrite_all(fd: int, data, offset: int) -> None:
    """os.pwrite until done: Linux writes at most ~2 GiB per call."""
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _reserve(fd: int, size: int, path: str) -> None:
    """Take the bucket's memory now, so a full tmpfs (a container's /dev/shm is often 64 MB) is one
    clear error up front, never a half-written version or a worker killed reading a hole (SIGBUS)."""
    if not size:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        os.unlink(path)  # never reused: its pages were not all there
        free = os.statvfs(os.path.dirname(path))
        raise OSError(e.errno, f"weight update: {os.path.dirname(path)} cannot hold a {size / 2**20:.0f} MiB bucket "
                               f"({free.f_bavail * free.f_frsize / 2**20:.0f} MiB free; updates keep the model's size "
                               "there): give the node's /dev/shm more room (docker: --shm-size)") from None


def read(folder: str, buckets: Buckets) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, CPU tensor) in plan order; each bucket's file is mapped when its first tensor is asked
    for and unmapped once nothing references its tensors (the engine copies them into its weights).
    A private mapping: nothing here can write back into the actor's files."""
    for i, specs in enumerate(buckets):
        path = os.path.join(folder, f"bucket-{i}")
        size = sum(_nbytes(dtype, shape) for _, dtype, shape in specs)
        if os.path.getsize(path) != size:
            raise ValueError(f"{path}: {os.path.getsize(path)} bytes, the bucket's tensors need {size}")
        if not size:
            yield from ((name, torch.empty(shape, dtype=getattr(torch, dtype))) for name, dtype, shape in specs)
            continue
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
        flat = torch.frombuffer(mm, dtype=torch.uint8)  # keeps `mm` alive as long as a view of it lives
        offset = 0
        for name, dtype, shape in specs:
            n = _nbytes(dtype, shape)
            yield name, flat[offset:offset + n].view(getattr(torch, dtype)).view(shape)
            offset += n
        del flat, mm


def remove(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)
