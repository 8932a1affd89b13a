"""Evaluation on a fixed prompt set: unbiased pass@k, mean@k, and the shaped reward.

For each of the task's `eval.prompts` eval prompts (`task.eval_set(size, seed)`: the same every
time; `all`: every row of the eval file) the policy samples n = `eval.samples` completions; each
gets the run's shaped reward, and a completion is *correct* when its reward is at least
`advantage.r_min_correct`.

- pass@k (Chen et al. 2021, unbiased): per prompt with c correct of n, 1 - C(n-c, k) / C(n, k),
  the chance that k samples drawn without replacement from the n hold at least one correct one;
  averaged over prompts.
- mean@k: per prompt the share of its first k samples that are correct, averaged over prompts
  (accuracy; comparable across reward scales, e.g. the paper's 10-step and 4-step runs).
- reward@k: the same average over the shaped reward itself (depends on the scale and reward form).

Tasks that sort their prompts into categories (`task.category(prompt)`: the code verifier's
first_correct, second_correct, both_correct, both_incorrect, single) get every metric per
category too, as `eval/<category>/<metric>`.

Sampling is seeded by `eval.seed` inside a forked RNG, so the numbers depend only on the
weights, and evaluating in the middle of training leaves the trainer's random streams untouched.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import torch

from streamrl.models import sampling

ROWS_PER_GENERATE = 256  # prompts x samples per generate call: bounds memory, keeps batches large


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k), as the product 1 - Π_{i=n-c+1..n} (1 - k/i) (no huge binomials)."""
    if not 0 < k <= n:
        raise ValueError(f"pass@k: k={k} must be 1..n (n={n} samples)")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k: c={c} correct must be 0..n (n={n})")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_at_k(rewards: Sequence[Sequence[float]], k: int) -> float:
    """Mean over prompts of the average reward of each prompt's first k samples. rewards: (prompts, n)."""
    if not rewards:
        raise ValueError("mean@k: no prompts")
    if any(not 0 < k <= len(row) for row in rewards):
        raise ValueError(f"mean@k: k={k} must be 1..n for every prompt (n={min(len(r) for r in rewards)})")
    return sum(sum(row[:k]) / k for row in rewards) / len(rewards)


def _metrics(rewards: Sequence[Sequence[float]], r_min_correct: float, ks: Sequence[int], prefix: str) -> dict:
    correct = [[1.0 if r >= r_min_correct else 0.0 for r in row] for row in rewards]
    out: dict = {}
    for k in ks:
        out[f"{prefix}pass@{k}"] = sum(pass_at_k(len(row), int(sum(row)), k) for row in correct) / len(correct)
    for k in ks:
        out[f"{prefix}mean@{k}"] = mean_at_k(correct, k)
    for k in ks:
        out[f"{prefix}reward@{k}"] = mean_at_k(rewards, k)
    out[f"{prefix}reward_mean"] = sum(map(sum, rewards)) / sum(map(len, rewards))
    out[f"{prefix}prompts"] = len(rewards)
    return out


def summarize(rewards: Sequence[Sequence[float]], r_min_correct: float, ks: Sequence[int],
              categories: Sequence[str] | None = None) -> dict:
    """eval/pass@k, eval/mean@k (correctness) and eval/reward@k (shaped) for each k, eval/reward_mean and
    eval/prompts from a (prompts, n) reward table; with `categories` (one per prompt) the same per category."""
    out = _metrics(rewards, r_min_correct, ks, "eval/")
    for cat in dict.fromkeys(categories or ()):
        rows = [row for row, c in zip(rewards, categories) if c == cat]
        out.update(_metrics(rows, r_min_correct, ks, f"eval/{cat}/"))
    return out


def sample_rewards(model, tokenizer, reward, prompts, n: int, *, temperature: float, max_new_tokens: int,
                   seed: int, encode=None, caps: list[int] | None = None) -> list[list[float]]:
    """(len(prompts), n) shaped rewards of n fresh samples per prompt, seeded inside a forked RNG."""
    return sample_scored(model, tokenizer, reward, prompts, n, temperature=temperature,
                         max_new_tokens=max_new_tokens, seed=seed, encode=encode, caps=caps)[0]


@torch.no_grad()
def sample_scored(model, tokenizer, reward, prompts, n: int, *, temperature: float, max_new_tokens: int,
                  seed: int, encode=None, drawn: list | None = None,
                  caps: list[int] | None = None) -> tuple[list[list[float]], list[list[str]]]:
    """(rewards, texts), each (len(prompts), n): n fresh samples per prompt, seeded inside a forked RNG.
    encode(text) → prompt ids as the actors make them (streamrl.models.prompting.PromptEncoder); None: raw text.
    drawn: when given, gets (prompt ids, sampling.Completion) of every sample, in the order of the table's rows.
    caps: per prompt, its completions' cap under model.max_seq_len (cut where its room ends, as the actors cut)."""
    from streamrl.models.model import end_token_ids

    device = next(model.parameters()).device
    ids = [encode(p) if encode else tokenizer(p.text, add_special_tokens=False)["input_ids"] for p in prompts]
    per_call = max(1, ROWS_PER_GENERATE // n)
    table: list[list[float]] = []
    texts: list[list[str]] = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for start in range(0, len(prompts), per_call):
            groups = sampling.generate(model, ids[start:start + per_call], n, temperature=temperature,
                                       max_new_tokens=max_new_tokens, pad_id=tokenizer.pad_token_id,
                                       eos_id=end_token_ids(model, tokenizer), device=device)
            if caps is not None:
                groups = [[sampling.capped(c, max(0, cap)) for c in group]
                          for cap, group in zip(caps[start:start + per_call], groups)]
            for prompt, p_ids, group in zip(prompts[start:start + per_call], ids[start:start + per_call], groups):
                if drawn is not None:
                    drawn.extend((p_ids, c) for c in group)
                texts.append([tokenizer.decode(c.tokens, skip_special_tokens=True) for c in group])
                table.append([reward(prompt, t) for t in texts[-1]])
    return table, texts


def correction_accuracy(model, tokenizer, reward, prompts, rewards: list[list[float]], drawn: list, cfg,
                        seed: int) -> dict:
    """Multi-layer GRPO in eval: one correction per sample, its query made as the actors make it (the prompt's
    tokens, the response's own tokens and a guiding phrase in one assistant turn: mgrpo.layer2_ids), scored by
    the original prompt's verifier; eval/acc_t1, eval/acc_t2 and the deltas. drawn: (prompt ids, Completion)
    of each sample (sample_scored's), row by row."""
    import random

    from streamrl.algo import mgrpo

    rng = random.Random(seed)
    owners = [p for p, row in zip(prompts, rewards) for _ in row]
    limit = mgrpo.query_limit(cfg)
    queries = [mgrpo.cap_query(mgrpo.layer2_ids(p_ids, c.tokens, c.finish_reason == "stop",
                                                mgrpo.phrase_ids(tokenizer, mgrpo.pick_phrase(cfg.mgrpo.phrases, rng))),
                               limit, len(p_ids))[0] for p_ids, c in drawn]
    _, fixed = sample_scored(model, tokenizer, lambda *_: 0.0, queries, 1, temperature=cfg.eval.temperature,
                             max_new_tokens=cfg.eval.max_new_tokens or cfg.actors.max_new_tokens, seed=seed + 1,
                             encode=list)
    t2 = [reward(p, row[0]) >= cfg.advantage.r_min_correct for p, row in zip(owners, fixed)]
    t1 = [r >= cfg.advantage.r_min_correct for row in rewards for r in row]
    return {f"eval/{k}": v for k, v in mgrpo.accuracy(t1, t2).items()}


class Evaluator:
    """Samples and scores the fixed eval set with a model (one kept on the CPU unless one is given).

    `reward` is the run's `streamrl.tasks.rewards.Reward`; its task gives the eval prompts.
    """

    def __init__(self, cfg, reward, model=None, tokenizer=None):
        from streamrl.models import model as model_lib

        self.cfg, self.reward = cfg, reward
        if model is None:
            model, tokenizer = model_lib.build(cfg, reward.task.vocabulary)
        self.model, self.tokenizer = model.eval(), tokenizer
        from streamrl.models.prompting import PromptEncoder

        self.encode = PromptEncoder.from_config(cfg, tokenizer)  # prompts as the actors encode them
        self.prompts = reward.task.eval_set(cfg.eval.size, cfg.eval.seed)
        category = getattr(reward.task, "category", None)
        self.categories = [category(p) for p in self.prompts] if category else None

    @torch.no_grad()
    def load(self, state: dict) -> None:
        """Replace the model's weights ({name: tensor}, e.g. the learner's full_state_dict)."""
        self.model.load_state_dict(state, strict=True)

    def run(self, state: dict | None = None) -> dict:
        """The eval/* metrics of `state` (None: the weights the model holds); eval/unparseable is a share of samples."""
        t0 = time.perf_counter()
        if state is not None:
            self.load(state)
        before = self.reward.unparseable
        e = self.cfg.eval
        drawn: list = []
        table, _ = sample_scored(self.model, self.tokenizer, self.reward, self.prompts, e.samples,
                                 temperature=e.temperature,
                                 max_new_tokens=e.max_new_tokens or self.cfg.actors.max_new_tokens, seed=e.seed,
                                 encode=self.encode, drawn=drawn)
        out = summarize(table, self.cfg.advantage.r_min_correct, self.cfg.eval.ks, self.categories)
        out["eval/unparseable"] = (self.reward.unparseable - before) / sum(map(len, table))
        if self.cfg.mgrpo.enabled:
            out.update(correction_accuracy(self.model, self.tokenizer, self.reward, self.prompts, table, drawn,
                                           self.cfg, e.seed))
        out["eval/samples"] = self.cfg.eval.samples
        out["eval_s"] = time.perf_counter() - t0
        return out
