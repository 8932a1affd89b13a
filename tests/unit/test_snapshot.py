"""streamrl.snapshot: the learner's weights are copied into reused buffers that are never written
while ZeroMQ may still be sending them."""

from __future__ import annotations

import torch

from streamrl.snapshot import SnapshotPool


class FakeTracker:
    def __init__(self, done: bool = False):
        self.done = done


def state(value: float) -> dict:
    return {"w": torch.full((3, 4), value), "b": torch.full((5,), value, dtype=torch.bfloat16),
            "step": torch.tensor(int(value)), "empty": torch.empty(0, 2)}


def test_a_snapshot_holds_a_copy_that_later_updates_of_the_source_do_not_touch():
    pool, live = SnapshotPool(), state(1.0)
    snap = pool.fill(live)
    for t in live.values():
        t.add_(1)
    assert [t.tolist() for t in snap.tensors] == [t.tolist() for t in state(1.0).values()]
    assert [t.dtype for t in snap.tensors] == [t.dtype for t in live.values()]
    assert [f.nbytes for f in snap.frames] == [t.numel() * t.element_size() for t in live.values()]
    assert bytes(snap.frames[0]) == state(1.0)["w"].numpy().tobytes()


def test_a_snapshot_in_flight_or_newest_is_never_refilled_and_a_free_one_is_reused():
    pool = SnapshotPool()
    first = pool.fill(state(1.0))
    tracker = FakeTracker(done=False)
    first.trackers.append(tracker)
    second = pool.fill(state(2.0))
    assert second is not first
    third = pool.fill(state(3.0))  # first still in flight, second was the newest
    assert third not in (first, second)
    assert first.tensors[0][0, 0] == 1.0 and second.tensors[0][0, 0] == 2.0
    tracker.done = True
    assert pool.fill(state(4.0)) is first  # sent and not the newest: refilled in place
    assert pool.allocated == 3 and first.tensors[0][0, 0] == 4.0


def test_past_keep_copies_the_oldest_busy_one_leaves_the_pool_unchanged_and_nothing_waits():
    pool = SnapshotPool(keep=2)
    snaps = []
    for v in range(5):
        snaps.append(pool.fill(state(float(v))))
        snaps[-1].trackers.append(FakeTracker(done=False))  # a subscriber that never reads
    assert len({id(s) for s in snaps}) == 5 and len(pool.copies) == 2 and pool.dropped == 3
    assert [s.tensors[0][0, 0].item() for s in snaps] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_a_new_layout_starts_a_new_pool():
    pool = SnapshotPool()
    pool.fill(state(1.0))
    snap = pool.fill({"other": torch.ones(7)})
    assert len(pool.copies) == 1 and snap.tensors[0].tolist() == [1.0] * 7
