"""The learner's peak memory for one optimizer step on a release-sized vocabulary, with and without
micro-batching: `python -m streamrl.bench.peak_memory` (CPU; one fresh process per setting).

The model is a Qwen3 of the given vocabulary (151,936 rows, as Qwen3's) with a small hidden size,
fp32; the batch is the default 16 groups × 8 samples of random tokens. Peak memory is the step's
rise of the process's resident high-water mark (Linux VmHWM, reset right before the step), next to
the size of one batch of full-vocabulary fp32 logits.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp


def _vm(field: str) -> int:
    """A /proc/self/status figure in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _step(args: dict, overrides: list[str], out) -> None:
    import random

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.set_num_threads(1)
    from streamrl import config
    from streamrl.comm.codec import ScoredGroup
    from streamrl.learner import step
    from streamrl.learner.engine import Engine

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=args["vocab"], hidden_size=args["hidden"], intermediate_size=2 * args["hidden"], num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=args["hidden"] // 4, tie_word_embeddings=True))
    cfg = config.load(None, ["advantage.estimator=grpo", *overrides])
    engine = Engine(cfg, model)
    rng = random.Random(0)
    V, P, C = args["vocab"], args["prompt"], args["completion"]
    groups = [ScoredGroup.from_samples(
        prompt_id=f"p{i}", policy_version=0, actor_id="a", prompt_tokens=[rng.randrange(V) for _ in range(P)],
        completions=[[rng.randrange(V) for _ in range(C)] for _ in range(8)], logprobs=[[-12.0] * C] * 8,
        rewards=[rng.random() for _ in range(8)], finish_reasons=["length"] * 8) for i in range(16)]
    rss = _vm("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    done = step.train(engine, groups, cfg, pad_id=0)  # the step's peak includes its batch, as the learner's does
    B, L1 = done.tensors["completion_mask"].shape  # (B, L-1): the batch's rows of L tokens
    out.put({"overrides": overrides, "params": sum(p.numel() for p in model.parameters()),
             "step_peak_bytes": _vm("VmHWM") - rss, "process_peak_bytes": _vm("VmHWM"),
             "full_logits_bytes": B * (L1 + 1) * V * 4, "micro_batches": done.micro_batches or 1,
             "fwd_bwd_s": done.fwd_bwd_s})
    engine.close()


def measure(args: dict, overrides: list[str]) -> dict:
    """One step in a fresh process (so earlier settings' peaks do not count)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_step, args=(args, overrides, q))
    p.start()
    res = q.get(timeout=1800)
    p.join(60)
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=12, help="prompt tokens per sample")
    ap.add_argument("--completion", type=int, default=4, help="completion tokens per sample")
    ap.add_argument("--micro-batch-tokens", type=int, default=256)
    ap.add_argument("--chunk-tokens", type=int, default=128)
    a = ap.parse_args(argv)
    args = vars(a)
    without = measure(args, ["learner.micro_batch_tokens=0", f"learner.logprob_chunk_tokens={1 << 30}"])
    with_ = measure(args, [f"learner.micro_batch_tokens={a.micro_batch_tokens}",
                           f"learner.logprob_chunk_tokens={a.chunk_tokens}"])
    for name, r in (("without", without), ("with", with_)):
        print(json.dumps({"setting": name, **r}))
    print(json.dumps({"step_peak_ratio_with_over_without": with_["step_peak_bytes"] / without["step_peak_bytes"]}))


if __name__ == "__main__":
    main()
