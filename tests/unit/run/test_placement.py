"""Actor placement: GPUs and seeds from the actor's index."""

from __future__ import annotations

import pytest

from streamrl.run.placement import actor_gpus, actor_seed, actors_per_node, cuda_visible_devices


def test_actors_on_one_node_get_disjoint_gpus_that_cover_it():
    for tp in (1, 2, 4, 8):
        per_node = actors_per_node(tp, 8)
        taken = [g for i in range(per_node) for g in actor_gpus(i, tp, 8)]
        assert sorted(taken) == list(range(8)) and all(len(actor_gpus(i, tp, 8)) == tp for i in range(per_node))


def test_the_next_node_starts_again_from_gpu_zero():
    assert actor_gpus(0, 2, 8) == [0, 1] and actor_gpus(3, 2, 8) == [6, 7] and actor_gpus(4, 2, 8) == [0, 1]
    assert actor_gpus(5, 8, 8) == list(range(8))  # one engine per node: every node's actor takes all its GPUs


def test_cuda_visible_devices_lists_the_actors_gpus():
    assert cuda_visible_devices(1, 4, 8) == "4,5,6,7" and cuda_visible_devices(2, 1, 8) == "2"


def test_a_tensor_parallel_size_that_does_not_divide_the_node_is_refused_with_the_allowed_sizes():
    with pytest.raises(ValueError, match=r"tensor_parallel_size=3: must divide the node's 8 GPUs \(allowed: \[1, 2, 4, 8\]\)"):
        actor_gpus(0, 3, 8)
    with pytest.raises(ValueError, match="tensor_parallel_size=16"):
        actor_gpus(0, 16, 8)
    with pytest.raises(ValueError, match="index -1"):
        actor_gpus(-1, 1, 8)


def test_each_actor_has_its_own_seed():
    assert [actor_seed(5, i) for i in range(4)] == [5, 6, 7, 8]
