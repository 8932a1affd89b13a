"""`streamrl bench trl`: streamrl against TRL's GRPOTrainer, time to the same rolling mean reward.

Both train the same random-init tiny model (`model.build` with the same seed) on the same task and
reward (`task.score`), with the same algorithm where the two overlap: GRPO's group-mean baseline
without std scaling (streamrl `advantage.estimator=grpo`; TRL `scale_rewards="none"`), one optimizer
step per batch of 16 prompts × 8 samples, token-level loss over the batch (TRL's `dapo`), no KL
term, the same learning rate, betas, clipping, float32 weights and sampling settings.

TRL is configured as its docs and source say for this size on a CPU: transformers generation
(`use_vllm=False`), one generation per optimizer step (`steps_per_generation=1`,
`gradient_accumulation_steps=1`, `per_device_train_batch_size` = 16 prompts × 8 = 128 completions,
`num_generations=8`), torch using every core, no logging, evaluation, saving or progress bar, and
**`bf16=False`**: GRPOConfig defaults `bf16` to True, which on a CPU runs every matmul under bf16
autocast (several times slower here than fp32, see docs/reference/benchmarks.md) — the gap between this bench's old TRL
figures (286–318 ms/step) and a plain GRPOTrainer script (≈115 ms/step).

Each system runs in its own fresh process (streamrl: `streamrl run`, learner + 2 actors; TRL: this
module as a child), the runs interleaved (streamrl first on even runs, TRL first on odd ones) so both
see the same machine load, with the same seed in each pair. Two clocks per step:

- end to end: from launching the process to the end of the step (streamrl: when its record appears
  in metrics.jsonl, polled every 50 ms; TRL: the child's wall clock at `on_step_end`);
- training: streamrl's learner `elapsed_s` (from the learner being ready: engine built, first weights
  published; it includes waiting for the actors' first groups), TRL's from `on_train_begin`.

Time to target is the first step whose trailing WINDOW-step mean reward reaches the target; a run
stops at the highest target or at its step cap. TRL is not a dependency: `pip install trl` (the
`bench-trl` extra; `test` installs it too).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from streamrl.config import Config

WINDOW = 10
"""Steps the mean reward is taken over (one step's batch mean is noisy)."""

TARGETS = (0.5, 0.9)
"""Rolling mean rewards timed; a run stops at the highest."""

TASKS = {
    # name: (overrides, step cap)
    "copy 8x6": (["task.num_symbols=8", "task.length=6", "actors.max_new_tokens=6"], 800),
    "copy 12x8": (["task.num_symbols=12", "task.length=8", "actors.max_new_tokens=8"], 2000),
}
"""The default comparison task (8 symbols × 6 positions) and a harder one (12 × 8)."""

COMMON = ["advantage.estimator=grpo", "advantage.r_min_correct=1.0"]
"""The algorithm both systems share (r_min_correct is unused by grpo; 1.0 is a level of every task)."""

RUN_TIMEOUT_S = 900
"""A run still going after this is stopped and counted as not reaching the target."""


def _first_reaching(rewards: list[float], times: list[float], target: float) -> float | None:
    """Time of the first step whose trailing WINDOW-step mean reward is ≥ target (None: never)."""
    for i in range(WINDOW - 1, len(rewards)):
        if sum(rewards[i - WINDOW + 1:i + 1]) / WINDOW >= target:
            return times[i]
    return None


def _step_reaching(rewards: list[float], target: float) -> int | None:
    """Number of steps taken when the trailing mean first reaches `target` (None: never)."""
    hit = _first_reaching(rewards, list(range(1, len(rewards) + 1)), target)
    return int(hit) if hit is not None else None


def _streamrl(overrides: list[str], stop_at: float, workdir: Path) -> dict:
    """`streamrl run` (learner + 2 actors) until the rolling reward reaches `stop_at` or the step cap."""
    import signal

    from streamrl.commands import launch

    ports = launch.free_ports(3)
    args = [*overrides, "name=bench-trl", f"run_dir={workdir}", "monitoring.learner_port=0", "monitoring.actor_port=0",
            *(f"transport.{k}={p}" for k, p in zip(("group_port", "weights_port", "weights_request_port"), ports))]
    metrics = workdir / "bench-trl" / "metrics.jsonl"
    rewards, train, e2e = [], [], []
    begun = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "streamrl", "run", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = b""
    while proc.poll() is None and time.time() - begun < RUN_TIMEOUT_S:
        time.sleep(0.05)
        data = metrics.read_bytes() if metrics.exists() else b""
        now = time.time() - begun
        for line in data[len(seen):].split(b"\n")[:-1]:  # complete lines only
            rec = json.loads(line)
            rewards.append(rec["reward_mean"])
            train.append(rec["elapsed_s"])
            e2e.append(now)
        seen = data[:data.rfind(b"\n") + 1] if b"\n" in data else b""
        if _step_reaching(rewards, stop_at) is not None:
            break
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # the launcher's clean stop
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    elif proc.returncode != 0:
        raise RuntimeError(f"streamrl run failed (exit {proc.returncode}): {proc.stderr.read()[-2000:]}")
    return {"rewards": rewards, "train_s": train, "e2e_s": e2e}


def _trl(overrides: list[str], steps: int, stop_at: float, workdir: Path) -> dict:
    """TRL's GRPOTrainer in a fresh child process (this module's `main`), timed from its launch."""
    out = workdir / "trl-steps.jsonl"
    begun = time.time()
    # torch's OpenMP threads spin while they wait for each other: on a shared machine one descheduled thread
    # stalls every parallel region (measured: fwd+bwd 3.7-5.3 s at load 14-20 against 0.18-0.21 s passive).
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    proc = subprocess.run([sys.executable, "-m", "streamrl.bench.trl", json.dumps(overrides), str(steps),
                           str(stop_at), str(workdir)], capture_output=True, text=True, timeout=RUN_TIMEOUT_S + 120,
                          env=env)
    if proc.returncode != 0:
        if "pip install trl" in proc.stderr:
            raise SystemExit(proc.stderr.strip().splitlines()[-1])
        raise RuntimeError(f"TRL child failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    return {"rewards": [r["reward"] for r in recs], "train_s": [r["train_s"] for r in recs],
            "e2e_s": [r["wall"] - begun for r in recs], "threads": recs[0]["threads"] if recs else None}


def _trl_child(overrides: list[str], steps: int, stop_at: float, workdir: Path) -> None:
    """The TRL side, in its own process: train, appending one line per step to trl-steps.jsonl."""
    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)))  # every core this process may use
    try:
        from datasets import Dataset
        from datasets.table import InMemoryTable
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as e:
        raise SystemExit(f"streamrl bench trl needs TRL: pip install trl ({e})") from None

    from streamrl import config, tasks
    from streamrl.models import model

    cfg = config.load(None, overrides)
    policy, tokenizer = model.build(cfg)
    if cfg.model.path is None:  # TRL trains a transformers model: the same weights and tokenizer, transformers' own
        from streamrl.models.tiny_llama import to_transformers

        policy, tokenizer = to_transformers(policy), tokenizer.to_transformers()
    task = tasks.build(cfg.task)
    rng = random.Random(cfg.seed)
    per_step = cfg.learner.batch_groups
    prompts = [task.sample(rng) for _ in range(steps * per_step)]
    # A fixed fingerprint: `Dataset.from_dict` hashes the table with dill, which fails on pyarrow's types here.
    table = InMemoryTable.from_pydict({"prompt": [p.text for p in prompts], "index": list(range(len(prompts)))})
    dataset = Dataset(table, fingerprint="streamrl-bench-trl")
    rewards: list[float] = []
    log = open(workdir / "trl-steps.jsonl", "w", buffering=1)
    started = [0.0]

    def reward(prompts, completions, index, **_) -> list[float]:  # one call per generation batch = one step
        scores = [task.score(by_index[i], c) for i, c in zip(index, completions)]
        rewards.append(sum(scores) / len(scores))
        return scores

    by_index = dict(enumerate(prompts))

    class StopAtTarget(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            started[0] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):  # after the optimizer step
            log.write(json.dumps({"reward": rewards[-1], "train_s": time.perf_counter() - started[0],
                                  "wall": time.time(), "threads": torch.get_num_threads()}) + "\n")
            if _step_reaching(rewards, stop_at) is not None:
                control.should_training_stop = True

    args = _grpo_config(GRPOConfig, cfg, steps, workdir)
    trainer = GRPOTrainer(model=policy, reward_funcs=reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[StopAtTarget()])
    trainer.train()


def _grpo_config(GRPOConfig: type, cfg: Config, steps: int, workdir: Path):
    """TRL's settings for the same job as streamrl's: batch, sampling, optimizer, clipping and loss alike
    (GRPOConfig: the class `_trl_child` imported, where a missing TRL is one line)."""
    per_step = cfg.learner.batch_groups
    a, o = cfg.actors, cfg.optim
    return GRPOConfig(
        output_dir=str(workdir / "trl"), report_to="none", save_strategy="no", eval_strategy="no",
        use_cpu=True, bf16=False, fp16=False,  # fp32 as streamrl; TRL's default bf16 autocast is slow on CPU
        seed=cfg.seed, max_steps=steps,
        per_device_train_batch_size=per_step * a.group_size, gradient_accumulation_steps=1,
        num_generations=a.group_size, steps_per_generation=1, num_iterations=1, use_vllm=False,
        max_completion_length=a.max_new_tokens, temperature=a.temperature, top_p=a.top_p,
        learning_rate=o.lr, adam_beta1=o.betas[0], adam_beta2=o.betas[1], weight_decay=o.weight_decay,
        max_grad_norm=o.grad_clip, lr_scheduler_type="constant", warmup_steps=0, beta=0.0,
        epsilon=cfg.loss.clip_low, epsilon_high=cfg.loss.clip_high,
        scale_rewards="none", loss_type="dapo", gradient_checkpointing=False,  # streamrl does not recompute
        logging_steps=steps, disable_tqdm=True, log_completions=False,
        dataloader_num_workers=0, shuffle_dataset=False)


def _spread(xs: list[float | None]) -> str:
    """'min–median–max' of the runs; a run that never reached the target makes it 'n/a (k of n)'."""
    got = [x for x in xs if x is not None]
    if len(got) < len(xs):
        return f"not reached in {len(xs) - len(got)} of {len(xs)}"
    return f"{min(got):.1f} / {statistics.median(got):.1f} / {max(got):.1f}"


def trl(short: bool = False, runs: int = 3, tasks: list[str] | None = None) -> list[dict]:
    """Per (task, target, system): time to the target over `runs` interleaved runs; prints the table."""
    plan = {"copy 8x6": (TASKS["copy 8x6"][0], 12)} if short else {k: TASKS[k] for k in tasks or TASKS}
    runs = 1 if short else runs
    rows = []
    for name, (task_ov, cap) in plan.items():
        results: dict[str, list[dict]] = {"streamrl": [], "trl": []}
        for run in range(runs):
            overrides = [*COMMON, *task_ov, f"seed={run}", f"steps={cap}"]
            order = ["streamrl", "trl"] if run % 2 == 0 else ["trl", "streamrl"]
            for system in order:
                load = os.getloadavg()[0]
                with tempfile.TemporaryDirectory() as tmp:
                    r = (_streamrl(overrides, max(TARGETS), Path(tmp)) if system == "streamrl"
                         else _trl(overrides, cap, max(TARGETS), Path(tmp)))
                r["load"] = load
                results[system].append(r)
                hits = "  ".join(f"{t}: {_step_reaching(r['rewards'], t)} steps, train "
                                 f"{_first_reaching(r['rewards'], r['train_s'], t)} s, end-to-end "
                                 f"{_first_reaching(r['rewards'], r['e2e_s'], t)} s" for t in TARGETS)
                print(f"  {name} run {run} {system}: {hits}; {len(r['rewards'])} steps, "
                      f"{1e3 * r['train_s'][-1] / max(1, len(r['train_s'])):.0f} ms/step, "
                      f"end-to-end {r['e2e_s'][-1] if r['e2e_s'] else float('nan'):.1f} s, load {load:.1f}",
                      file=sys.stderr, flush=True)
        for target in TARGETS:
            row = {"bench": "trl", "task": name, "target": target, "runs": runs}
            for system, rs in results.items():
                for clock in ("train_s", "e2e_s"):
                    row[f"{system}_{clock}"] = [_first_reaching(r["rewards"], r[clock], target) for r in rs]
                row[f"{system}_steps"] = [_step_reaching(r["rewards"], target) for r in rs]
                row[f"{system}_ms_per_step"] = [round(1e3 * r["train_s"][-1] / len(r["train_s"]))
                                                if r["train_s"] else None for r in rs]
            row["trl_threads"] = results["trl"][0].get("threads")
            row["load"] = [round(r["load"], 1) for rs in results.values() for r in rs]
            row["streamrl_faster_e2e_every_run"] = all(
                s is not None and (t is None or s < t) for s, t in zip(row["streamrl_e2e_s"], row["trl_e2e_s"]))
            rows.append(row)
    _print_table(rows)
    return rows


def _print_table(rows: list[dict]) -> None:
    """The benchmarks page's table (docs/reference/benchmarks.md): seconds min / median / max over the runs, per clock and system."""
    print("| task | target | streamrl end to end (s) | TRL end to end (s) | streamrl training (s) | TRL training (s) "
          "| steps streamrl / TRL (median) | streamrl faster end to end in every run |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        med = [statistics.median(x) if (x := [v for v in r[f"{s}_steps"] if v is not None]) else None
               for s in ("streamrl", "trl")]
        print(f"| {r['task']} | {r['target']} | {_spread(r['streamrl_e2e_s'])} | {_spread(r['trl_e2e_s'])} "
              f"| {_spread(r['streamrl_train_s'])} | {_spread(r['trl_train_s'])} | {med[0]} / {med[1]} "
              f"| {'yes' if r['streamrl_faster_e2e_every_run'] else 'no'} |", flush=True)


if __name__ == "__main__":  # the TRL child: overrides (JSON list), step cap, stop reward, work dir
    _trl_child(json.loads(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4]))
