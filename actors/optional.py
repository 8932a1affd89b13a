"""The members an actor uses only where they exist, probed here alone: an engine backend (vllm, sglang) has
worker processes to close and engine stats to report; a task with reward functions has their threads to close.
Once the backend and task Protocols give these members defaults, the probes go."""

from __future__ import annotations


def close(backend) -> None:
    """An engine's worker processes go with the actor."""
    if hasattr(backend, "close"):
        backend.close()


def engine_stats(backend) -> dict:
    """{"engine": start time, update time, tokens/s} for an engine backend; {} otherwise."""
    return {"engine": backend.engine_stats()} if hasattr(backend, "engine_stats") else {}


def close_reward_functions(reward) -> None:
    """Reward functions' threads (an abandoned call may still run)."""
    if hasattr(reward.task, "functions"):
        reward.task.functions.close()
