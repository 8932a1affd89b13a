"""`streamrl check` plays what a run will play: for an episodic task (an environment's, an agent's, a verifiers
environment's episodes) it plays the first rows end to end, each a group of two episodes, on the tiny model (or the
configured model where its weights are small), and names each failure by row, function and reason, so a data bug or
a broken environment is found in seconds, before a run. The model's replies are whatever it samples: what is checked
is the user's code on the rows (the environment, its tools, the agent, the rubric), not the model."""

from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path

import msgspec

from streamrl import config as config_lib

ROWS_PLAYED = 3
MAX_WEIGHTS_BYTES = 1 << 30
"""A configured model with more weights than this is not loaded to check (the tiny model is not its stand-in: its
chat template and tokens differ); a run plays its episodes."""


def episodes_work(cfg: config_lib.Config) -> bool:
    """Play ROWS_PLAYED rows of an episodic task; each row's outcome on stderr. False when none played cleanly:
    a run would train on nothing of them (or stop on them)."""
    if config_lib.rollout_kind(cfg.task) == "single_turn":
        return True
    if cfg.model.path and _weights_bytes(Path(cfg.model.path)) > MAX_WEIGHTS_BYTES:
        print(f"streamrl check: episodes not played: {cfg.model.path}'s weights are over "
              f"{MAX_WEIGHTS_BYTES >> 30} GiB (a run plays them)", file=sys.stderr)
        return True
    with tempfile.TemporaryDirectory(prefix="streamrl-check-") as tmp:
        runner, reward, prompts = _runner(cfg, Path(tmp))
        try:
            outcomes = [_play(runner, p, i) for i, p in enumerate(prompts, 1)]
        finally:
            runner.close()
            reward.close()
    for line in outcomes:
        print(f"streamrl check: {line}", file=sys.stderr)
    if prompts and not any(" played: " in line for line in outcomes):
        print(f"streamrl check: error: no row of the {ROWS_PLAYED} tried played cleanly; a run would train on none "
              "of them", file=sys.stderr)
        return False
    return True


def _runner(cfg: config_lib.Config, tmp: Path):
    """The actor's own episode runner for `cfg`, with groups of two, a failure window no check fills, its endpoint
    on any free port, and its records in `tmp`."""
    from streamrl.actors import backends, rollouts
    from streamrl.actors.rollout import RolloutOptions
    from streamrl.models import model as model_lib
    from streamrl.tasks import rewards
    from streamrl.tasks.base import RowsTask

    (tmp / "config.yaml").write_text(config_lib.dump(cfg))
    cfg = config_lib.load(tmp / "config.yaml", ["actors.group_size=2", "task.reward_fail_window=1000000",
                                                "endpoint.port=0", "endpoint.record_turns=false", f"run_dir={tmp}"])
    reward = rewards.build(cfg)
    model, tok = model_lib.build(cfg, reward.task.vocabulary)
    backend = backends.build("hf", cfg, model, tok)
    runner = rollouts.runner(cfg, 0, backend, tok, reward, "check", backend.end_ids or [tok.eos_token_id],
                             RolloutOptions.from_config(cfg), random.Random(0))
    task = reward.task
    prompts = ([task.prompt(r) for r in task.train[:ROWS_PLAYED]] if isinstance(task, RowsTask) else
               [task.sample(random.Random(i)) for i in range(ROWS_PLAYED)])
    return runner, reward, prompts


def _play(runner, prompt, i: int) -> str:
    """One row's two episodes, and what became of them in one line: played (turns, rewards), or each failure by
    reason with the function's first error."""
    from streamrl.tasks.reward_health import UserCodeFailure, error_line

    where = getattr(prompt, "where", "") or f"row {i}"
    try:
        groups, stats, done = runner.make_groups([prompt], version=0)
    except UserCodeFailure as e:  # a tool's window can fill within one row's episodes
        return f"row {i} ({where}): {e.kind} {e.function}: {e.reason}: {e.error}"
    except Exception as e:
        return f"row {i} ({where}): the episode runner raised {type(e).__name__}: {e}"
    failed = {k.removeprefix("reward_"): v for k, v in msgspec.structs.asdict(done).items()
              if k.startswith("reward_") and k != "reward_calls_failed" and v}
    if stats.step_raised:
        failed["step_raised"] = stats.step_raised
    if not failed and groups:
        g = groups[0]
        return f"row {i} ({where}) played: {len(g.rewards)} episodes, model turns {stats.turns}, rewards {g.rewards}"
    details = [f"bad data: {reason}" for w, reason in runner.bad_rows.rows.items() if w == where]
    for window in (getattr(runner, name, None) for name in ("env_health", "health", "tool_health")):
        if window is not None:
            details += [f"{name}: {why}: {error_line(detail)}" for name, (why, detail) in window.first.items()]
            window.first.clear()  # the next row's failures are its own
    return (f"row {i} ({where}) failed: {failed or 'nothing scored'}" +
            (f" — {'; '.join(dict.fromkeys(details))}" if details else ""))


def _weights_bytes(path: Path) -> int:
    """The size of a model folder's weight files (safetensors, bin)."""
    return sum(p.stat().st_size for pattern in ("*.safetensors", "*.bin") for p in path.glob(pattern))
