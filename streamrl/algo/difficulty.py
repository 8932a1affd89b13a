"""Difficulty filtering: leave out prompts that are (almost) always or (almost) never solved.

A prompt whose success rate over N rollouts is above `difficulty.high` (0.9) or below
`difficulty.low` (0.1) teaches little: its groups have (nearly) all rewards on one side of
`advantage.r_min_correct`. "Success" is a shaped reward ≥ r_min_correct.

- Online: `SuccessTracker` counts successes per prompt id as groups are scored; an actor asks
  `keep(prompt_id)` before using a prompt (wired in with `difficulty.online`).
- Offline (`streamrl.commands.difficulty`): `streamrl difficulty CONFIG --rollouts N --out FILE.jsonl [--checkpoint RUN_OR_CHECKPOINT]`
  samples N rollouts per prompt with the initial (or a saved) policy, at the actors' temperature
  and length cap (what training will see). For a task with a dataset (code_verifier with
  `task.data`) the prompts are the dataset's rows and FILE gets the kept rows verbatim (a new
  `task.data`). A task without a finite dataset (the symbol tasks, the synthetic verifier set) is
  filtered over `task.eval_set(--prompts)`, and FILE gets one `{"id", "text", "success_rate"}` line
  per kept prompt.
"""

from __future__ import annotations

from typing import Sequence

from streamrl.config import Config


class SuccessTracker:
    """Per prompt id: successes and samples seen. A prompt is excluded once it has at least
    `rollouts` samples and a success rate outside [low, high]. Memory grows with distinct prompt ids."""

    def __init__(self, rollouts: int, low: float, high: float):
        if rollouts < 1:
            raise ValueError(f"rollouts={rollouts}: must be at least 1")
        if not 0 <= low < high <= 1:
            raise ValueError(f"low={low}, high={high}: need 0 <= low < high <= 1")
        self.rollouts, self.low, self.high = rollouts, low, high
        self.counts: dict[str, list[int]] = {}  # prompt id -> [successes, samples]
        self.excluded_by_reason = {"too_easy": 0, "too_hard": 0}
        self._excluded: set[str] = set()

    @classmethod
    def from_config(cls, cfg: Config) -> "SuccessTracker":
        d = cfg.difficulty
        return cls(d.rollouts, d.low, d.high)

    def observe(self, prompt_id: str, rewards: Sequence[float], r_min_correct: float) -> None:
        """Count a group's samples: those with reward ≥ r_min_correct are successes."""
        c = self.counts.setdefault(prompt_id, [0, 0])
        c[0] += sum(r >= r_min_correct for r in rewards)
        c[1] += len(rewards)
        verdict = self._verdict(c)
        if verdict and prompt_id not in self._excluded:
            self._excluded.add(prompt_id)
            self.excluded_by_reason[verdict] += 1

    def rate(self, prompt_id: str) -> float | None:
        """Success rate so far (None: never seen)."""
        c = self.counts.get(prompt_id)
        return c[0] / c[1] if c and c[1] else None

    def keep(self, prompt_id: str) -> bool:
        """False once the prompt has `rollouts` samples and its rate lies outside [low, high]."""
        return prompt_id not in self._excluded

    @property
    def excluded(self) -> int:
        """How many prompts are excluded."""
        return len(self._excluded)

    def _verdict(self, c: list[int]) -> str | None:
        if c[1] < self.rollouts:
            return None
        rate = c[0] / c[1]
        return "too_easy" if rate > self.high else "too_hard" if rate < self.low else None


def in_band(rate: float, low: float, high: float) -> bool:
    """Kept: low ≤ rate ≤ high."""
    return low <= rate <= high
