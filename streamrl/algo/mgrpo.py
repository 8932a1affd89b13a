"""Multi-layer GRPO (Ding et al., "Multi-Layer GRPO"): a self-correction layer in the rollout.

Layer 1 is the usual group. In layer 2 each layer-1 response becomes a new query: the original
query, the response, and a guiding phrase drawn from a pool. The actor samples one correction per
query; a rule-based verifier (the task's own reward) keeps the corrections that end correct and
discards the rest; each kept correction plus H further samples of its query form a layer-2 group
with advantages of its own. This module holds the parts both sides need: the query (and its cap at
the model's context), the phrase words (the tiny model's vocabulary), how the two layers share an
actor's budget, and the five accuracy metrics.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Sequence, TypeVar

G = TypeVar("G")

# The two guiding phrases the MGRPO paper's examples quote; the pool is `mgrpo.phrases`.
DEFAULT_PHRASES = (
    "Wait, let me double-check that.",
    "Where might I have gone wrong this time? Let me double-check carefully.",
)


def layer2_query(query: str, response: str, phrase: str) -> str:
    """The text a correction is sampled from: original query, the layer-1 response, the phrase."""
    return f"{query} {response}\n{phrase}"


def cap_query(ids: Sequence[int], limit: int, head: int) -> tuple[list[int], int]:
    """A layer-2 query's token ids cut to `limit` (0: no cap), and how many tokens were cut.

    Keeps the first `head` tokens (the original query; at most half the limit) and the last
    limit - head (the end of the response, where its answer is, and the guiding phrase).
    """
    if not limit or len(ids) <= limit:
        return list(ids), 0
    head = min(head, limit // 2)
    return [*ids[:head], *ids[len(ids) - (limit - head):]], len(ids) - limit


def query_limit(cfg) -> int:
    """Most tokens a layer-2 query may hold so that it and a completion fit the model's context:
    `mgrpo.max_query_tokens`, else model.max_seq_len (or the model's context: the folder's
    max_position_embeddings, the tiny model's model.context) minus actors.max_new_tokens (0: no cap,
    a folder that names no context)."""
    if cfg.mgrpo.max_query_tokens:
        return cfg.mgrpo.max_query_tokens
    if getattr(cfg.model, "max_seq_len", None):
        return max(1, cfg.model.max_seq_len - cfg.actors.max_new_tokens)
    if not cfg.model.path:
        return max(1, cfg.model.context - cfg.actors.max_new_tokens)
    path = Path(cfg.model.path) / "config.json"
    if not path.is_file():
        return 0  # a hub id: its context is read by the engine; set mgrpo.max_query_tokens to cap here
    context = json.loads(path.read_text()).get("max_position_embeddings") or 0
    return max(1, context - cfg.actors.max_new_tokens) if context else 0


def fill_budget(groups: Sequence[G], budget: int, layer2_share: float) -> list[G]:
    """The groups of one generate call an actor sends when they outnumber its budget.

    Layer-2 groups (`.layer == 2`) get round(budget × layer2_share) slots, at least one when the
    budget holds two or more and the share is above 0; layer-1 groups take the rest; slots one
    layer cannot fill go to the other. Within a layer the order is kept. The mix is a property of
    the config, not of the batch shape: a layer-1-first trim starved layer 2 whenever the prompts
    of one call filled the budget (MGRPO's paper shape: 32 groups over 8 actors is 4 per actor).
    """
    if len(groups) <= budget:
        return list(groups)
    first = [g for g in groups if getattr(g, "layer", 1) == 1]
    second = [g for g in groups if getattr(g, "layer", 1) != 1]
    want = round(budget * layer2_share)
    if layer2_share > 0 and budget >= 2:
        want = max(1, want)
    n2 = min(len(second), want)
    n1 = min(len(first), budget - n2)
    n2 = min(len(second), budget - n1)
    keep = {id(g) for g in first[:n1]} | {id(g) for g in second[:n2]}
    return [g for g in groups if id(g) in keep]


def pick_phrase(phrases: Sequence[str], rng: random.Random) -> str:
    return phrases[rng.randrange(len(phrases))]


def phrase_words(phrases: Sequence[str]) -> list[str]:
    """Whitespace words of the phrases (added to the tiny model's word-level vocabulary)."""
    return list(dict.fromkeys(w for p in phrases for w in p.split()))


def accuracy(t1_correct: Sequence[bool], t2_correct: Sequence[bool]) -> dict[str, float]:
    """Acc@t1, Acc@t2, Δ(t1, t2) = Acc@t2 − Acc@t1, Δ_i→c and Δ_c→i, over paired samples.

    t1_correct[i]: layer-1 response i is correct; t2_correct[i]: its (first) correction is correct.
    Δ_i→c is the share of samples wrong at t1 and right at t2, Δ_c→i the reverse, so
    Δ(t1, t2) = Δ_i→c − Δ_c→i.
    """
    if len(t1_correct) != len(t2_correct):
        raise ValueError(f"{len(t1_correct)} layer-1 outcomes but {len(t2_correct)} corrections")
    n = len(t1_correct)
    if n == 0:
        return {}
    acc1 = sum(t1_correct) / n
    acc2 = sum(t2_correct) / n
    return {
        "acc_t1": acc1,
        "acc_t2": acc2,
        "delta_t1_t2": acc2 - acc1,
        "delta_i2c": sum(1 for a, b in zip(t1_correct, t2_correct) if not a and b) / n,
        "delta_c2i": sum(1 for a, b in zip(t1_correct, t2_correct) if a and not b) / n,
    }


def layer2_coverage(steps: Sequence[tuple[int, int, float]]) -> dict:
    """How often layer 2 trained once corrections exist. steps: per learner step, (step, layer2_groups, acc_t2)
    of its batch. From the first step whose batch holds a verified correction (a layer-2 group, or a layer-1
    sample whose correction verified) on: the steps, those that trained layer-2 groups, their share, the groups."""
    first = next((i for i, (_, n2, acc2) in enumerate(steps) if n2 or acc2), None)
    if first is None:
        return {"first_correction_step": None, "steps_since": 0, "steps_with_layer2": 0, "share": None,
                "layer2_groups": 0}
    since = steps[first:]
    with_layer2 = sum(1 for _, n2, _ in since if n2)
    return {"first_correction_step": steps[first][0], "steps_since": len(since), "steps_with_layer2": with_layer2,
            "share": with_layer2 / len(since), "layer2_groups": sum(n2 for _, n2, _ in since)}
