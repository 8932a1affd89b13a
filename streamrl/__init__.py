"""streamrl: asynchronous RL for language models with ordinal rewards.

This package holds what actors and the learner share (config, wire messages, transport,
advantages, losses, the staleness rule, learning-signal statistics, tasks, the CLI). It runs no
loop of its own and never imports vllm, sglang or deepspeed at module level.
"""

__version__ = "0.1.0"
