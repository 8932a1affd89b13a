"""Where an actor runs and what it draws: its GPUs on its node and its engine's seed, both from its
index alone, so every process (and a launcher starting them) computes the same answer.

Actor i of a node with `gpus_per_node` GPUs and engines of `tp` GPUs each (`actors.tensor_parallel_size`)
takes GPUs [slot·tp, slot·tp + tp) with slot = i mod (gpus_per_node // tp): indices 0..k-1 fill the
first node, k..2k-1 the next, and so on (a launcher numbering actors node by node gets distinct GPUs).
"""

from __future__ import annotations


def actors_per_node(tp: int, gpus_per_node: int) -> int:
    """How many engines of `tp` GPUs fit on a node; a one-line error when none fits or GPUs would idle."""
    if tp < 1 or gpus_per_node < 1:
        raise ValueError(f"actors.tensor_parallel_size={tp}, gpus_per_node={gpus_per_node}: both must be >= 1")
    if tp > gpus_per_node or gpus_per_node % tp:
        raise ValueError(f"actors.tensor_parallel_size={tp}: must divide the node's {gpus_per_node} GPUs "
                         f"(allowed: {[d for d in range(1, gpus_per_node + 1) if gpus_per_node % d == 0]})")
    return gpus_per_node // tp


def actor_gpus(index: int, tp: int, gpus_per_node: int) -> list[int]:
    """The node-local GPU ids actor `index` runs its engine on (len tp, distinct from its node's other actors)."""
    if index < 0:
        raise ValueError(f"actor index {index}: must be >= 0")
    slot = index % actors_per_node(tp, gpus_per_node)
    return list(range(slot * tp, slot * tp + tp))


def cuda_visible_devices(index: int, tp: int, gpus_per_node: int) -> str:
    """actor_gpus as the CUDA_VISIBLE_DEVICES value a launcher sets for the actor's process ("2,3")."""
    return ",".join(map(str, actor_gpus(index, tp, gpus_per_node)))


def actor_seed(seed: int, index: int) -> int:
    """The sampling seed of actor `index`'s engine: seed + index, so no two actors draw one stream."""
    return seed + index
