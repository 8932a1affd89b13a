"""`streamrl bench trl`: streamrl against TRL's GRPOTrainer, wall time to the same mean reward.

Both train the same random-init tiny model (the default job's: `model.build` with the same seed)
on the same task and reward (`task.score`), with the same algorithm where the two overlap: GRPO's
group-mean baseline without std scaling (streamrl `advantage.estimator=grpo`; TRL
`scale_rewards="none"`), one optimizer step per batch of 16 prompts × 8 samples, token-level loss
normalised over the batch (TRL's `dapo`), no KL term, the same learning rate, betas, clipping and
sampling temperature. Both get the whole machine: streamrl as its usual learner + 2 actor
processes, TRL as one process (generation and training in turn, torch using every core).

The clock starts when training starts (streamrl: the learner's `elapsed_s`, after its engine is
built; TRL: `trainer.train()`), and stops at the first step where the mean reward over the last
`window` steps reaches `target`. The ratio is TRL's time over streamrl's.

TRL is not a dependency of streamrl: `pip install trl` first (the `bench-trl` extra).
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path

WINDOW = 10
"""Steps the mean reward is taken over (one step's batch mean is noisy)."""


def _first_reaching(rewards: list[float], times: list[float], target: float) -> float | None:
    """Time of the first step whose trailing WINDOW-step mean reward is ≥ target (None: never)."""
    for i in range(WINDOW - 1, len(rewards)):
        if sum(rewards[i - WINDOW + 1:i + 1]) / WINDOW >= target:
            return times[i]
    return None


def _streamrl(overrides: list[str], workdir: Path) -> tuple[list[float], list[float]]:
    """The default job (learner + 2 actors, `streamrl run`); per-step mean reward and elapsed time."""
    import subprocess
    import sys

    from streamrl.commands import launch

    ports = launch.free_ports(3)
    args = [*overrides, "name=bench-trl", f"run_dir={workdir}", "monitoring.learner_port=0", "monitoring.actor_port=0",
            *(f"transport.{k}={p}" for k, p in zip(("group_port", "weights_port", "weights_request_port"), ports))]
    subprocess.run([sys.executable, "-m", "streamrl", "run", *args], check=True, capture_output=True, timeout=3600)
    recs = [json.loads(x) for x in (workdir / "bench-trl" / "metrics.jsonl").read_text().splitlines()]
    return [r["reward_mean"] for r in recs], [r["elapsed_s"] for r in recs]


def _trl(overrides: list[str], steps: int, target: float, workdir: Path) -> tuple[list[float], list[float]]:
    """TRL's GRPOTrainer on the same model, prompts and reward; stops once `target` is reached."""
    try:
        from datasets import Dataset
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as e:
        raise SystemExit(f"streamrl bench trl needs TRL: pip install trl ({e})") from None

    from streamrl import config, model, tasks

    cfg = config.load(None, overrides)
    policy, tokenizer = model.build(cfg)
    task = tasks.build(cfg.task)
    rng = random.Random(cfg.seed)
    per_step = cfg.learner.batch_groups
    prompts = [task.sample(rng) for _ in range(steps * per_step)]
    dataset = Dataset.from_dict({"prompt": [p.text for p in prompts], "index": list(range(len(prompts)))})
    rewards: list[float] = []
    times: list[float] = []
    started = [0.0]

    def reward(prompts, completions, index, **_) -> list[float]:  # one call per generation batch = one step
        scores = [task.score(prompts_by_index[i], c) for i, c in zip(index, completions)]
        rewards.append(sum(scores) / len(scores))
        times.append(time.perf_counter() - started[0])
        return scores

    prompts_by_index = dict(enumerate(prompts))

    class StopAtTarget(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            started[0] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if _first_reaching(rewards, times, target) is not None:
                control.should_training_stop = True

    a, o = cfg.actors, cfg.optim
    args = GRPOConfig(
        output_dir=str(workdir / "trl"), report_to="none", save_strategy="no", use_cpu=True, seed=cfg.seed,
        max_steps=steps, per_device_train_batch_size=per_step * a.group_size, num_generations=a.group_size,
        steps_per_generation=1, max_completion_length=a.max_new_tokens, temperature=a.temperature, top_p=a.top_p,
        learning_rate=o.lr, adam_beta1=o.betas[0], adam_beta2=o.betas[1], weight_decay=o.weight_decay,
        max_grad_norm=o.grad_clip, lr_scheduler_type="constant", warmup_steps=0, beta=0.0,
        scale_rewards="none", loss_type="dapo", gradient_checkpointing=False,  # streamrl does not recompute
        logging_steps=max(1, steps), disable_tqdm=True,
        dataloader_num_workers=0, shuffle_dataset=False)
    trainer = GRPOTrainer(model=policy, reward_funcs=reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[StopAtTarget()])
    trainer.train()
    return rewards, times


def trl(short: bool = False, target: float = 0.5) -> list[dict]:
    """Seconds to a mean reward of `target` for streamrl (async) and TRL, and their ratio."""
    steps = 12 if short else 400
    overrides = [f"steps={steps}", "advantage.estimator=grpo"]
    with tempfile.TemporaryDirectory() as tmp:
        s_rewards, s_times = _streamrl(overrides, Path(tmp))
        t_rewards, t_times = _trl(overrides, steps, target, Path(tmp))
    s_at, t_at = _first_reaching(s_rewards, s_times, target), _first_reaching(t_rewards, t_times, target)
    return [{"bench": "trl", "target_reward": target, "streamrl_s": s_at, "trl_s": t_at,
             "trl_over_streamrl": t_at / s_at if s_at and t_at else None,
             "streamrl_steps": len(s_rewards), "trl_steps": len(t_rewards),
             "streamrl_ms_per_step": 1e3 * s_times[-1] / len(s_times),
             "trl_ms_per_step": 1e3 * t_times[-1] / len(t_times) if t_times else None}]
