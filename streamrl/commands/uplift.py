"""Uplift analysis (the paper's Figure 3): which correct answers did training make more likely?

Sample N completions per *training* prompt (distinct prompts from the task's training stream,
seeded by `eval.seed`) from the *initial* policy, keep each prompt's distinct correct ones (shaped
reward ≥ `advantage.r_min_correct`; a completion sampled twice counts once), and score each with
teacher forcing at temperature 1 under the initial (pre) and the trained (post: the newest
checkpoint's policy.safetensors) policy: log p(completion | prompt), summed over its tokens. Rank
each prompt's correct answers among themselves by pre log-prob (rank 0 = that prompt's most likely
correct answer under the initial policy: log-probs of different prompts are not comparable), split
the ranks 0..max into B ranges, and report per range, over every prompt's answers at those ranks,
the mean log ratio log(post/pre), its exp (`geo_mean_ratio`, the geometric mean of the ratios) and
the mean of the ratios themselves (`mean_ratio`, dominated by the largest). A policy that only
sharpens what it already preferred lifts the first buckets; one that finds rarer correct answers
lifts the last ones. Written to RUN_DIR/uplift.json.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Sequence

from streamrl import config as config_lib
from streamrl.config import Config
from streamrl.commands import options
from streamrl.run import jsonfiles

RANKS = ("rank within each prompt's distinct correct answers; rank 0 = its highest log-prob under the initial "
         "policy; rank_lo..rank_hi inclusive")
RATIOS = ("mean_log_ratio = mean of log(post/pre); geo_mean_ratio = exp(mean_log_ratio); "
          "mean_ratio = mean of post/pre (null if it overflows)")


def ranks_within(prompt_of: Sequence, pre: Sequence[float]) -> list[int]:
    """Each sample's rank among the samples of its own prompt by pre log-prob (0 = highest; ties keep input
    order). prompt_of, pre: (n,)."""
    ranks, seen = [0] * len(pre), {}
    for i in sorted(range(len(pre)), key=lambda i: -pre[i]):
        ranks[i] = seen.get(prompt_of[i], 0)
        seen[prompt_of[i]] = ranks[i] + 1
    return ranks


def distinct_correct(drawn: Sequence[Sequence[tuple[Sequence[int], bool]]]) -> tuple[list[int], list, int]:
    """(prompt index of each, completion tokens, repeats dropped): every prompt's correct completions, each
    distinct one once. drawn[i]: prompt i's samples as (tokens, correct)."""
    owner, kept, repeats = [], [], 0
    for i, samples in enumerate(drawn):
        seen = set()
        for tokens, ok in samples:
            if not ok:
                continue
            if tuple(tokens) in seen:
                repeats += 1
                continue
            seen.add(tuple(tokens))
            owner.append(i)
            kept.append(list(tokens))
    return owner, kept, repeats


def buckets(pre: Sequence[float], post: Sequence[float], num_buckets: int,
            prompt_of: Sequence | None = None) -> list[dict]:
    """Rank samples by pre log-prob (highest first; ties keep input order) within their prompt (`prompt_of`,
    None: one prompt), split the ranks 0..max into min(num_buckets, max + 1) ranges of sizes differing by
    at most one, and average over the samples at each range's ranks. pre, post: (n,) sequence log-probs."""
    if len(pre) != len(post):
        raise ValueError(f"uplift: {len(pre)} pre log-probs but {len(post)} post")
    if num_buckets < 1:
        raise ValueError(f"uplift: buckets={num_buckets} must be at least 1")
    ranks = ranks_within(prompt_of if prompt_of is not None else [0] * len(pre), pre)
    n = max(ranks) + 1 if ranks else 0
    count = min(num_buckets, n)
    out = []
    for b in range(count):
        lo, hi = b * n // count, (b + 1) * n // count
        logs = [post[i] - pre[i] for i in range(len(pre)) if lo <= ranks[i] < hi]
        mean_log = sum(logs) / len(logs)
        peak = max(logs)
        log_mean_ratio = peak + math.log(sum(math.exp(x - peak) for x in logs) / len(logs))  # log-sum-exp
        out.append({"bucket": b, "rank_lo": lo, "rank_hi": hi - 1, "count": len(logs), "mean_log_ratio": mean_log,
                    "geo_mean_ratio": _exp(mean_log), "mean_ratio": _exp(log_mean_ratio)})
    return out


def _exp(x: float) -> float | None:
    return math.exp(x) if x < 700 else None  # JSON has no inf


def prompt_ids(cfg: Config, tokenizer, prompts) -> list[list[int]]:
    """Each prompt's token ids as the run's actors encoded them (streamrl.models.prompting: the chat template where
    the model has one), so the log-probs ranked are those of the sequences training saw."""
    from streamrl.models.prompting import PromptEncoder

    encode = PromptEncoder.from_config(cfg, tokenizer)
    return [encode(p) for p in prompts]


def analyse(run_dir: str | Path, overrides: list[str], prompts: int, samples: int, num_buckets: int,
            out: Path | None = None) -> dict:
    """Sample from the run's initial policy, score under initial and final, bucket; write and return the result."""
    import torch

    from streamrl.models import model as model_lib
    from streamrl.models import sampling
    from streamrl.run import checkpoints
    from streamrl.tasks import distinct, rewards

    cfg = checkpoints.run_config(run_dir, overrides)
    reward = rewards.build(cfg)
    pre_model, tok = model_lib.build(cfg, reward.task.vocabulary)  # seeded by cfg.seed: the run's initial weights
    weights = checkpoints.checkpoint_of(run_dir)
    post_model, _ = checkpoints.load_policy(cfg, run_dir, weights)
    pre_model.eval()
    items = distinct(reward.task.sample, prompts, cfg.eval.seed)   # training prompts, as the paper ranks
    ids = prompt_ids(cfg, tok, items)
    max_new = cfg.eval.max_new_tokens or cfg.actors.max_new_tokens
    drawn: list[list[tuple[list[int], bool]]] = []   # per prompt: (completion tokens, correct?)
    per_call = max(1, 256 // samples)
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        for start in range(0, len(items), per_call):
            groups = sampling.generate(pre_model, ids[start:start + per_call], samples,
                                       temperature=cfg.eval.temperature, max_new_tokens=max_new,
                                       pad_id=tok.pad_token_id, eos_id=model_lib.end_token_ids(pre_model, tok))
            for prompt, group in zip(items[start:start + per_call], groups):
                drawn.append([(c.tokens, reward(prompt, tok.decode(c.tokens, skip_special_tokens=True))
                               >= cfg.advantage.r_min_correct) for c in group])
    owner, correct, duplicates = distinct_correct(drawn)
    correct_prompts = [ids[i] for i in owner]
    pre = sampling.sequence_logprobs(pre_model, correct_prompts, correct, tok.pad_token_id, temperature=1.0)
    post = sampling.sequence_logprobs(post_model, correct_prompts, correct, tok.pad_token_id, temperature=1.0)
    result = {
        "pre": f"initial policy: {cfg.model.path or f'streamrl.models.model.build (tiny random init, seed {cfg.seed})'}",
        "post": str(weights),
        "samples_correct": len(correct),
        "duplicates_dropped": duplicates,
        "samples_total": len(items) * samples,
        "prompts": len(items),
        "samples_per_prompt": samples,
        "temperature": cfg.eval.temperature,
        "ranks": RANKS,
        "ratios": RATIOS,
        "prompts_with_correct": len(set(owner)),
        "buckets": buckets(pre, post, num_buckets, owner) if correct else [],
    }
    out = out or checkpoints.run_dir_of(run_dir) / "uplift.json"
    jsonfiles.write(out, result)
    result["out"] = str(out)
    return result


def report(result: dict) -> str:
    """A few lines for the terminal: one per bucket."""
    lines = [f"streamrl uplift: {result['samples_correct']} distinct correct of {result['samples_total']} samples "
             f"({result['duplicates_dropped']} repeats dropped) over {result['prompts_with_correct']} of "
             f"{result['prompts']} training prompts, from the initial policy; ranks within each prompt; "
             f"post = {result['post']} -> {result.get('out')}"]
    for b in result["buckets"]:
        lines.append(f"  bucket {b['bucket']}  ranks {b['rank_lo']:>5}-{b['rank_hi']:<5}  n {b['count']:>5}  "
                     f"mean log ratio {b['mean_log_ratio']:+.3f}  geo-mean ratio {_fmt(b['geo_mean_ratio'])}  "
                     f"mean ratio {_fmt(b['mean_ratio'])}")
    if not result["buckets"]:
        lines.append("  no correct samples: try more --samples or --prompts")
    return "\n".join(lines)


def _fmt(v: float | None) -> str:
    return "overflow" if v is None else f"{v:.3g}"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("uplift",
                              help="how training moved the likelihood of correct samples, by their initial rank")
    p.add_argument("args", nargs="*", help="RUN_DIR, then key=value overrides")
    p.add_argument("--prompts", type=int, default=64, help="training prompts to sample (default 64)")
    p.add_argument("--samples", type=int, default=64, help="samples per prompt from the initial policy (default 64)")
    p.add_argument("--buckets", type=int, default=5, help="rank buckets (default 5)")
    p.add_argument("--out", default=None, help="result file (default: RUN_DIR/uplift.json)")


def main(args: argparse.Namespace) -> int:
    return options.tool(args, lambda: _main(args))


def _main(args: argparse.Namespace) -> int:
    path, overrides = options.split_args(args.args)
    if path is None:
        raise config_lib.ConfigError("streamrl uplift: give a RUN_DIR")
    options.at_least_one(args, "prompts", "samples", "buckets")
    out = Path(args.out) if args.out else None
    print(report(analyse(path, overrides, args.prompts, args.samples, args.buckets, out)))
    return 0
