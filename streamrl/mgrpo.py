"""Multi-layer GRPO (Ding et al., "Multi-Layer GRPO"): a self-correction layer in the rollout.

Layer 1 is the usual group. In layer 2 each layer-1 response becomes a new query: the original
query, the response, and a guiding phrase drawn from a pool. The actor samples one correction per
query; a rule-based verifier (the task's own reward) keeps the corrections that end correct and
discards the rest; each kept correction plus H further samples of its query form a layer-2 group
with advantages of its own. This module holds the parts both sides need: the query, the phrase
words (the tiny model's vocabulary) and the five accuracy metrics.
"""

from __future__ import annotations

import random
from typing import Sequence

# The two guiding phrases the MGRPO paper's examples quote; the pool is `mgrpo.phrases`.
DEFAULT_PHRASES = (
    "Wait, let me double-check that.",
    "Where might I have gone wrong this time? Let me double-check carefully.",
)


def layer2_query(query: str, response: str, phrase: str) -> str:
    """The text a correction is sampled from: original query, the layer-1 response, the phrase."""
    return f"{query} {response}\n{phrase}"


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
