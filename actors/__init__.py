"""The actor process: generation backends, the rollout step, weight sync, and the main loop."""
