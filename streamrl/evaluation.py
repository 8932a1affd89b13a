"""Evaluation on fixed prompt sets: unbiased pass@k, mean@k, and the shaped reward.

An eval set is the task's own (`eval.prompts` prompts of `task.eval_set(size, seed)`: the same every
time; `all`: every row of the eval file) or, with `eval.sets: {name: file}`, each named file read as
`task.eval_data` would be; each set's metrics are `eval/<name>/<metric>` (the task's own set: `eval/<metric>`).
For every prompt the policy samples n = `eval.samples` completions (at most `eval.max_new_tokens`, within
`model.max_seq_len` with the prompt; a prompt with no room is skipped and counted as `prompts_too_long`);
each gets the run's shaped reward, and a completion is *correct* when its reward is at least
`advantage.r_min_correct`.

- pass@k (Chen et al. 2021, unbiased): per prompt with c correct of n, 1 - C(n-c, k) / C(n, k),
  the chance that k samples drawn without replacement from the n hold at least one correct one;
  averaged over prompts.
- mean@k: per prompt the share of its first k samples that are correct, averaged over prompts
  (accuracy; comparable across reward scales, e.g. the paper's 10-step and 4-step runs).
- reward@k: the same average over the shaped reward itself (depends on the scale and reward form).

Tasks that sort their prompts into categories (`task.category(prompt)`: the code verifier's
first_correct, second_correct, both_correct, both_incorrect, single) get every metric per
category too, as `eval/[<set>/]<category>/<metric>`.

Each set is cut into `eval.actors` shards (`shards`); a shard is sampled in calls of at most
ROWS_PER_GENERATE rows, call c seeded with the shard's seed + c, so its numbers depend only on the
weights and the shard, never on which engine process ran it or what ran before. During training the
actors run the shards on their engines (`streamrl.actors.evals`, asked by `streamrl.learner.evals`,
which sums them up with `set_metrics`); `streamrl eval` runs the same shards in turn on one model
(`Evaluator`), so on the same backend it gives the learner's numbers exactly. Local sampling runs in a
forked RNG, so evaluating leaves the caller's random streams untouched.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from streamrl.config import Config
from streamrl.models import sampling

ROWS_PER_GENERATE = 256  # prompts x samples per generate call: bounds memory, keeps batches large

Sampler = Callable[[list[list[int]], int, int, int], list]
"""sample(prompt ids, n, max_new_tokens, seed) -> n Completions per prompt, drawn at eval.temperature with that seed."""


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
    if not rewards:  # every prompt of the set was too long for model.max_seq_len
        return {f"{prefix}prompts": 0}
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
              categories: Sequence[str] | None = None, prefix: str = "eval/") -> dict:
    """<prefix>pass@k, mean@k (correctness) and reward@k (shaped) for each k, reward_mean and prompts from a
    (prompts, n) reward table; with `categories` (one per prompt) the same per category, <prefix><category>/..."""
    out = _metrics(rewards, r_min_correct, ks, prefix)
    for cat in dict.fromkeys(categories or ()):
        rows = [row for row, c in zip(rewards, categories) if c == cat]
        out.update(_metrics(rows, r_min_correct, ks, f"{prefix}{cat}/"))
    return out


class EvalSet(NamedTuple):
    name: str
    """"" for the task's own eval set, else its key in eval.sets."""
    prompts: list
    categories: list[str] | None
    """task.category of each prompt, where the task sorts prompts into categories."""

    @property
    def prefix(self) -> str:
        return f"eval/{self.name}/" if self.name else "eval/"


def eval_sets(cfg: Config, task) -> list[EvalSet]:
    """The run's eval sets: eval.sets read as task.eval_data (each through the task's own reader), else the
    task's own eval set. Raises ValueError naming a set the task cannot read."""
    import msgspec

    from streamrl.tasks import base

    e = cfg.eval
    if not e.sets:
        return [_eval_set("", task, task.eval_set(e.size, e.seed))]
    out = []
    for name, path in e.sets.items():
        reader = base.build(msgspec.structs.replace(cfg.task, eval_data=path))
        try:
            if getattr(reader, "eval_rows", None) is None:
                raise ValueError(f"eval.sets.{name}={path}: task {cfg.task.name!r} reads no eval file (only tasks "
                                 "over data rows do: dataset, code_verifier, math_answer, ...)")
            out.append(_eval_set(name, task, reader.eval_set(e.size, e.seed)))
        finally:
            base.optional(reader, "close")()  # a dataset task's reward pool: the run's own task scores
    return out


def _eval_set(name: str, task, prompts: list) -> EvalSet:
    from streamrl.tasks.base import optional

    category = optional(task, "category")
    return EvalSet(name, prompts, [category(p) for p in prompts] if category else None)


class Shard(NamedTuple):
    """Rows [start, stop) of eval set `set`: what one actor evaluates for one request."""

    set: str
    start: int
    stop: int


def shards(sets: Sequence[EvalSet], parts: int) -> list[Shard]:
    """Each set cut into `parts` contiguous shards of near-equal size (empty ones left out)."""
    out = []
    for es in sets:
        n = len(es.prompts)
        bounds = [n * i // parts for i in range(parts + 1)]
        out += [Shard(es.name, a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
    return out


def shard_seed(seed: int, shard: Shard) -> int:
    """The sampling seed of a shard: eval.seed plus its first row (per set the same rows get the same draws)."""
    return seed + shard.start


class ShardScores(NamedTuple):
    rewards: list[list[float]]
    """(rows, n) shaped rewards; an empty row: a prompt with no room under model.max_seq_len."""
    unparseable: int
    corrected: list[bool] | None
    """Multi-layer GRPO: whether each sample's correction verified (samples in row order); None otherwise."""


def score_shard(sample: Sampler, tokenizer, reward, prompts: list, cfg: Config, seed: int) -> ShardScores:
    """Sample and score eval.samples completions of each prompt (the rows of one shard)."""
    from streamrl.models.prompting import PromptEncoder, room

    e = cfg.eval
    n, cap = e.samples, e.max_new_tokens or cfg.actors.max_new_tokens
    encode = PromptEncoder.from_config(cfg, tokenizer)  # prompts as the actors encode them
    ids = [encode(p) for p in prompts]
    rooms = [room(len(i), cap, cfg.model.max_seq_len) for i in ids]
    fits = [j for j, r in enumerate(rooms) if r > 0]
    rewards: list[list[float]] = [[] for _ in prompts]
    drawn: list[list] = [[] for _ in prompts]  # (prompt ids, Completion) of each sample: the layer-2 queries' parts
    before = reward.unparseable
    per_call = max(1, ROWS_PER_GENERATE // n)
    for call, at in enumerate(range(0, len(fits), per_call)):
        part = fits[at:at + per_call]
        groups = sample([ids[j] for j in part], n, max(rooms[j] for j in part), seed + call)
        for j, group in zip(part, groups):
            drawn[j] = [(ids[j], sampling.capped(c, rooms[j])) for c in group]
            rewards[j] = [reward(prompts[j], tokenizer.decode(c.tokens, skip_special_tokens=True)) for _, c in drawn[j]]
    unparseable = reward.unparseable - before
    corrected = None
    if cfg.mgrpo.enabled:
        corrected = corrections(sample, tokenizer, reward, [prompts[j] for j in fits], [drawn[j] for j in fits], cfg,
                                seed)
    return ShardScores(rewards, unparseable, corrected)


def corrections(sample: Sampler, tokenizer, reward, prompts, drawn: list[list], cfg: Config, seed: int) -> list[bool]:
    """Multi-layer GRPO in eval: one correction per sample, its query made as the actors make it (the prompt's
    tokens, the response's own tokens and a guiding phrase in one assistant turn: mgrpo.layer2_ids, capped by
    mgrpo.query_limit), scored by the original prompt's verifier; whether each verified, samples in row order.
    drawn: per prompt, (prompt ids, Completion) of each of its samples."""
    import random

    from streamrl.algo import mgrpo

    rng = random.Random(seed)
    owners = [p for p, row in zip(prompts, drawn) for _ in row]
    from streamrl.models.context import seq_cap

    context = seq_cap(cfg.model) or 0
    limit = mgrpo.query_limit(cfg, context)
    queries = [mgrpo.cap_query(mgrpo.layer2_ids(p_ids, c.tokens, c.finish_reason == "stop",
                                                mgrpo.phrase_ids(tokenizer, mgrpo.pick_phrase(cfg.mgrpo.phrases, rng))),
                               limit, len(p_ids))[0] for row in drawn for p_ids, c in row]
    cap = cfg.eval.max_new_tokens or cfg.actors.max_new_tokens
    fixed: list[str] = []
    for call, at in enumerate(range(0, len(queries), ROWS_PER_GENERATE)):
        part = queries[at:at + ROWS_PER_GENERATE]
        rooms = [min(cap, context - len(q)) if context else cap for q in part]  # a correction ends with the context
        groups = sample(part, 1, max(1, max(rooms)), seed + 1 + call)
        fixed += [tokenizer.decode(sampling.capped(g[0], max(0, r)).tokens, skip_special_tokens=True)
                  for g, r in zip(groups, rooms)]
    return [reward(p, t) >= cfg.advantage.r_min_correct for p, t in zip(owners, fixed)]


def set_metrics(cfg: Config, es: EvalSet, scores: Sequence[ShardScores]) -> dict:
    """The eval/[<set>/]* metrics of one set from its shards' scores, in row order."""
    from streamrl.algo import mgrpo

    rows = [row for s in scores for row in s.rewards]
    kept = [j for j, row in enumerate(rows) if row]
    cats = [es.categories[j] for j in kept] if es.categories else None
    p = es.prefix
    out = summarize([rows[j] for j in kept], cfg.advantage.r_min_correct, cfg.eval.ks, cats, p)
    samples = sum(map(len, rows))
    out[f"{p}unparseable"] = sum(s.unparseable for s in scores) / samples if samples else 0.0
    out[f"{p}prompts_too_long"] = len(rows) - len(kept)
    if cfg.mgrpo.enabled and kept:
        t1 = [r >= cfg.advantage.r_min_correct for j in kept for r in rows[j]]
        t2 = [c for s in scores for c in (s.corrected or [])]
        out.update({f"{p}{k}": v for k, v in mgrpo.accuracy(t1, t2).items()})
    return out


def local_sampler(model, tokenizer, temperature: float) -> Sampler:
    """A Sampler over a local torch model (the hf backend's and `streamrl eval`'s): sampling.generate with
    top_p 1, seeded inside a forked RNG."""
    from streamrl.models.model import end_token_ids

    device = next(model.parameters()).device
    eos = end_token_ids(model, tokenizer)

    @torch.no_grad()
    def sample(ids: list[list[int]], n: int, max_new_tokens: int, seed: int) -> list:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            return sampling.generate(model, ids, n, temperature=temperature, max_new_tokens=max_new_tokens,
                                     pad_id=tokenizer.pad_token_id, eos_id=eos, device=device)

    return sample


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


class Evaluator:
    """Evaluates every shard of every eval set in turn with one local model (kept on the CPU unless one is given):
    `streamrl eval`, offline or live, with the very shards and seeds the actors use during training.

    `reward` is the run's `streamrl.tasks.rewards.Reward`; its task gives the eval prompts.
    """

    def __init__(self, cfg: Config, reward, model=None, tokenizer=None):
        from streamrl.models import model as model_lib

        self.cfg, self.reward = cfg, reward
        if model is None:
            model, tokenizer = model_lib.build(cfg, reward.task.vocabulary)
        self.model, self.tokenizer = model.eval(), tokenizer
        from streamrl.models.prompting import PromptEncoder

        self.encode = PromptEncoder.from_config(cfg, tokenizer)  # what score_shard encodes prompts with
        self.sets = eval_sets(cfg, reward.task)
        self.sample = local_sampler(self.model, tokenizer, cfg.eval.temperature)

    @property
    def prompts(self) -> list:
        """Every eval prompt, set after set."""
        return [p for es in self.sets for p in es.prompts]

    @torch.no_grad()
    def load(self, state: dict) -> None:
        """Replace the model's weights ({name: tensor}, e.g. the learner's full_state_dict)."""
        self.model.load_state_dict(state, strict=True)

    def run(self, state: dict | None = None) -> dict:
        """The eval/* metrics of `state` (None: the weights the model holds); eval/unparseable is a share of samples."""
        t0 = time.perf_counter()
        if state is not None:
            self.load(state)
        out: dict = {}
        for es in self.sets:
            scores = [score_shard(self.sample, self.tokenizer, self.reward, es.prompts[sh.start:sh.stop], self.cfg,
                                  shard_seed(self.cfg.eval.seed, sh))
                      for sh in shards([es], self.cfg.eval.actors)]
            out.update(set_metrics(self.cfg, es, scores))
        out["eval/samples"] = self.cfg.eval.samples
        out["eval_s"] = time.perf_counter() - t0
        return out
