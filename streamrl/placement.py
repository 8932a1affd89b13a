"""Which GPUs of its node an actor drives: a pure function of its index and tensor parallelism.

A node with `gpus_per_node` GPUs runs `gpus_per_node // tp` actors side by side, each on `tp`
consecutive GPUs. Actors are numbered node after node (Slurm's block distribution: node n runs
indices n*k .. n*k+k-1), so index mod k is the actor's slot on its node.
"""

from __future__ import annotations


def actor_gpus(index: int, tp: int, gpus_per_node: int) -> list[int]:
    """The GPU ordinals (0-based, on the actor's node) that actor `index` drives with tensor
    parallelism `tp`. Actors beyond one node's slots wrap around (node-local numbering)."""
    if index < 0:
        raise ValueError(f"actor index {index}: must be at least 0")
    if tp < 1 or gpus_per_node < 1:
        raise ValueError(f"tensor_parallel_size={tp}, gpus_per_node={gpus_per_node}: both must be at least 1")
    if gpus_per_node % tp:
        raise ValueError(f"actors.tensor_parallel_size={tp} must divide the {gpus_per_node} GPUs of a node "
                         "(each actor takes tp whole GPUs)")
    slot = index % (gpus_per_node // tp)
    return list(range(slot * tp, (slot + 1) * tp))
