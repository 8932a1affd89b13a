"""The copy task as a SkyRL-Gym environment, in SkyRL's own terms: a `BaseTextEnv` made with
`(env_config, extras)`, its target in `extras["reward_spec"]["ground_truth"]` as in SkyRL's datasets. The model
writes the symbols back over `max_turns` turns (two: the first half, then, after the env says "next", the
rest); the reward, given on the last step, is the fraction right. Nothing here knows streamrl."""

from typing import Any, Dict

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput


class CopyEnv(BaseTextEnv):
    def __init__(self, env_config: Any = None, extras: Dict[str, Any] = {}):
        super().__init__()
        self.target = extras["reward_spec"]["ground_truth"].split()
        self.max_turns = int(extras.get("max_turns", 2))
        self.chunk = -(-len(self.target) // self.max_turns)  # symbols per turn
        self.said: list[str] = []

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        self.said += action.split()[:self.chunk]
        if self.turns < self.max_turns and len(self.said) < len(self.target):
            return BaseTextEnvStepOutput(observations=[{"role": "user", "content": "next"}], reward=0.0, done=False,
                                         metadata={})
        right = sum(a == b for a, b in zip(self.said, self.target))
        return BaseTextEnvStepOutput(observations=[], reward=right / len(self.target), done=True,
                                     metadata={"said": " ".join(self.said)})
