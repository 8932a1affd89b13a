"""The run directory: runs/<name>/{config.yaml, metrics.jsonl, summary.json, checkpoints/}."""

from __future__ import annotations

import json

from streamrl import config as config_lib
from streamrl import jsonfiles


class RunLog:
    def __init__(self, cfg: config_lib.Config):
        self.dir = cfg.run_path
        self.dir.mkdir(parents=True, exist_ok=True)
        self.checkpoints = self.dir / "checkpoints"
        (self.dir / "config.yaml").write_text(config_lib.dump(cfg))
        (self.dir / "summary.json").unlink(missing_ok=True)
        self.rewards: list[float] = []
        self.step_s = self.metrics_s = 0.0  # this process's steps: the base of the metrics overhead
        self._metrics = None

    def open(self, resumed_step: int) -> None:
        """Start metrics.jsonl afresh, or keep the records of the steps a resumed checkpoint holds
        (steps logged after that checkpoint are dropped: they are about to be redone)."""
        path = self.dir / "metrics.jsonl"
        kept = []
        if resumed_step and path.exists():
            kept = [line for line in path.read_text().splitlines()
                    if line.strip() and json.loads(line)["step"] < resumed_step]
        path.write_text("".join(line + "\n" for line in kept))
        self.rewards = [json.loads(line)["reward_mean"] for line in kept]
        self._metrics = open(path, "a", buffering=1)

    def step(self, record: dict) -> None:
        self.rewards.append(record["reward_mean"])
        self.step_s += record["step_s"]
        self.metrics_s += record.get("metrics_s", 0.0)
        self._metrics.write(jsonfiles.line(record))

    def summary(self, extra: dict, reward_range: tuple[float, float]) -> dict:
        n = len(self.rewards)
        k = max(1, n // 10)
        first = sum(self.rewards[:k]) / k if n else None
        last = sum(self.rewards[-k:]) / k if n else None
        span = reward_range[1] - reward_range[0]
        out = {
            "steps": n,
            "reward_first_10pct": first,
            "reward_last_10pct": last,
            "reward_range": list(reward_range),
            "improvement_fraction_of_range": (last - first) / span if n else None,
            **extra,
        }
        jsonfiles.write(self.dir / "summary.json", out)
        return out

    def close(self) -> None:
        self._metrics.close()
