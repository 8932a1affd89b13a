"""The learner process: receive → gate → batch → advantages → DeepSpeed step → publish."""
