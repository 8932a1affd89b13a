"""Actors on distinct GPUs: each actor's GPUs follow from its index and tensor parallelism alone."""

from __future__ import annotations

import pytest

from streamrl.placement import actor_gpus


def test_actors_of_one_node_take_disjoint_consecutive_gpus_covering_the_node():
    for tp in (1, 2, 4, 8):
        taken = [actor_gpus(i, tp, 8) for i in range(8 // tp)]
        assert all(len(g) == tp and g == list(range(g[0], g[0] + tp)) for g in taken)
        assert sorted(sum(taken, [])) == list(range(8))


def test_block_numbering_gives_node_local_slots():
    # Node n runs indices n*k .. n*k+k-1 (Slurm's block distribution): the same slots on every node.
    assert [actor_gpus(i, 2, 8) for i in range(8)] == [[0, 1], [2, 3], [4, 5], [6, 7]] * 2


def test_a_tensor_parallel_size_that_does_not_divide_the_node_is_refused():
    with pytest.raises(ValueError, match="must divide the 8 GPUs"):
        actor_gpus(0, 3, 8)
    with pytest.raises(ValueError, match="at least"):
        actor_gpus(-1, 1, 8)
