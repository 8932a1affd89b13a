"""LoRA against full fine-tuning on one model, measured: `python -m streamrl.bench.lora_measure [--model FOLDER]
[--rank 8] [--steps 3]` (CPU; one fresh process per setting; without --model, the release-shaped Qwen3 folder of
`streamrl.models.release_model` is built in a temporary folder).

For each setting the learner's DeepSpeed engine takes `steps` strictly on-policy steps on groups that an actor's
copy of the policy really sampled (the copy receives each version as the learner publishes it: the adapters only
with LoRA, every weight without), and reports:
  - publish_bytes: the bytes of one version (`Engine.published_state`, what goes over the weight channel);
  - trainable parameters, and the process's resident memory after the engine is built and its peak over the steps
    (Linux VmRSS/VmHWM; the first step allocates gradients and Adam state);
  - the strict self-check's statistics per step (is_ratio_max_abs_dev, the largest |learner/behaviour - 1| over
    completion tokens, and whether `stepstats.check_strict` passed at lag 0).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import tempfile

from streamrl.bench.peak_memory import _vm  # /proc/self/status figures in bytes


def _setting(model_path: str, overrides: list[str], steps: int, out) -> None:
    import copy
    import random

    import torch

    torch.set_num_threads(1)
    from streamrl import config, tasks
    from streamrl.comm.codec import ScoredGroup
    from streamrl.learner import step, stepstats
    from streamrl.learner.engine import Engine
    from streamrl.models import lora, model, prompting, sampling

    cfg = config.load(None, [f"model.path={model_path}", "on_policy=strict", "learner.batch_groups=2",
                             "learner.micro_batch_tokens=64", "advantage.estimator=grpo", *overrides])
    task = tasks.build(cfg.task)
    m, tok = model.build(cfg, task.vocabulary)
    actor = copy.deepcopy(m).eval()  # what an actor holds: the same build
    targets = lora.published(actor.state_dict())
    rss0 = _vm("VmRSS")
    engine = Engine(cfg, m)
    rss_engine = _vm("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM from here: the steps' peak
    encode = prompting.PromptEncoder.from_config(cfg, tok)
    eos = model.end_token_ids(m, tok)
    rng = random.Random(0)
    tol = stepstats.ratio_tolerance(None, cfg.model.dtype)
    records, publish_bytes = [], None
    for version in range(steps):
        state = engine.published_state()
        publish_bytes = sum(t.numel() * t.element_size() for t in state.values())
        with torch.no_grad():
            for k, t in state.items():
                targets[k].copy_(t)
        prompts = [encode(task.sample(rng).text) for _ in range(cfg.learner.batch_groups)]
        done = sampling.generate(actor, prompts, cfg.actors.group_size, temperature=1.0, max_new_tokens=4,
                                 pad_id=tok.pad_token_id, eos_id=eos)
        groups = [ScoredGroup.from_samples(
            prompt_id=f"p{i}", policy_version=version, actor_id="a", prompt_tokens=p,
            completions=[c.tokens for c in cs], logprobs=[c.logprobs for c in cs],
            rewards=[rng.random() for _ in cs], finish_reasons=[c.finish_reason for c in cs])
            for i, (p, cs) in enumerate(zip(prompts, done))]
        rec = step.train(engine, groups, cfg, tok.pad_token_id, step=version, version=version)
        try:
            stepstats.check_strict(rec, tol)
            passed = True
        except stepstats.StrictModeViolation:
            passed = False
        records.append({"step": version, "is_ratio_max_abs_dev": rec.is_ratio_max_abs_dev,
                        "log_ratio_abs_mean": rec.log_ratio_abs_mean, "strict_check_passed": passed})
    out.put({"overrides": overrides, "publish_bytes": publish_bytes, "published_tensors": len(state),
             "params": sum(p.numel() for p in m.parameters()),
             "trainable_params": sum(p.numel() for p in m.parameters() if p.requires_grad),
             "engine_rss_rise_bytes": rss_engine - rss0, "steps_peak_rss_bytes": _vm("VmHWM"),
             "steps_peak_rise_over_engine_bytes": _vm("VmHWM") - rss_engine, "strict_tolerance": tol,
             "steps": records})
    engine.close()


def measure(model_path: str, overrides: list[str], steps: int) -> dict:
    """One setting in a fresh process (so another setting's memory does not count)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_setting, args=(model_path, overrides, steps, q))
    p.start()
    res = q.get(timeout=1800)
    p.join(60)
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a Hugging Face model folder (default: the release-shaped Qwen3 folder, built)")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = a.model
        if path is None:
            from streamrl.models import release_model

            path = str(release_model.build(f"{tmp}/qwen3-shaped"))
        full = measure(path, ["lora.rank=0"], a.steps)
        adapted = measure(path, [f"lora.rank={a.rank}"], a.steps)
    for name, r in (("full", full), ("lora", adapted)):
        print(json.dumps({"setting": name, **r}))
    print(json.dumps({"publish_bytes_full_over_lora": full["publish_bytes"] / adapted["publish_bytes"],
                      "steps_peak_rss_full_over_lora": full["steps_peak_rss_bytes"] / adapted["steps_peak_rss_bytes"],
                      "steps_peak_rise_full_minus_lora_bytes":
                          full["steps_peak_rise_over_engine_bytes"] - adapted["steps_peak_rise_over_engine_bytes"]}))


if __name__ == "__main__":
    main()
