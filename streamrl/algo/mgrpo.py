"""Multi-layer GRPO (Ding et al., "Multi-Layer GRPO"): a self-correction layer in the rollout.

Layer 1 is the usual group. In layer 2 each layer-1 response becomes a new query that continues the
assistant's turn, as the paper's template does: the layer-1 prompt's token ids, the response's own
token ids (its end token dropped, never re-tokenised: what the model sampled is what it reads) and a
guiding phrase drawn from a pool. The actor samples one correction per query; a rule-based verifier
(the task's own reward) keeps the corrections that end correct and discards the rest; each kept
correction plus H further samples of its query form a layer-2 group with advantages of its own,
trained in the same step beside the layer-1 groups (added to the batch, not taking their places).
This module holds the parts both sides need: the query's tokens and their cap at the model's
context, the phrase words (the tiny model's vocabulary) and the five accuracy metrics.
"""

from __future__ import annotations

import random
from typing import Sequence

from streamrl.config import Config

# The two guiding phrases the MGRPO paper's examples quote; the pool is `mgrpo.phrases`. The paper speaks
# of a pool of seven; their exact text could not be read here (docs/guides/mgrpo.md says what was found).
PHRASE_SEPARATOR = "\n"
"""What goes between the first answer and the guiding phrase (the phrase starts a new line of the same turn)."""


def phrase_ids(tokenizer, phrase: str) -> list[int]:
    """The tokens a guiding phrase adds after a response: the separator and the phrase, no special tokens."""
    return list(tokenizer(PHRASE_SEPARATOR + phrase, add_special_tokens=False)["input_ids"])


def layer2_ids(prompt_ids: Sequence[int], response: Sequence[int], stopped: bool, phrase: Sequence[int]) -> list[int]:
    """A layer-2 query's token ids: the layer-1 prompt (P,), the response's own tokens (T,) without its end token
    when it ended on one (`stopped`: the turn goes on, it is not closed), then the phrase's tokens.
    Under a chat template the prompt ends with the assistant's generation prompt, so the first answer and the
    phrase sit in one assistant turn, as in the paper; nothing is rendered or tokenised again."""
    body = list(response[:-1]) if stopped and len(response) else list(response)
    return [*prompt_ids, *body, *phrase]


def cap_query(ids: Sequence[int], limit: int, head: int) -> tuple[list[int], int]:
    """A layer-2 query's token ids cut to `limit` (0: no cap), and how many tokens were cut.

    Keeps the first `head` tokens (the original query; at most half the limit) and the last
    limit - head (the end of the response, where its answer is, and the guiding phrase).
    """
    if not limit or len(ids) <= limit:
        return list(ids), 0
    head = min(head, limit // 2)
    return [*ids[:head], *ids[len(ids) - (limit - head):]], len(ids) - limit


def correction_room(cfg: Config) -> int:
    """Tokens a correction is always left: mgrpo.min_correction_tokens, at most actors.max_new_tokens."""
    return min(cfg.mgrpo.min_correction_tokens, cfg.actors.max_new_tokens)


def query_limit(cfg: Config, context: int) -> int:
    """Most tokens a layer-2 query may hold: `mgrpo.max_query_tokens`, else the model's context (prompt +
    completion tokens, streamrl.models.context.seq_cap; 0: unknown here) minus the correction's minimum room
    (`correction_room`); 0: no cap."""
    if cfg.mgrpo.max_query_tokens:
        return cfg.mgrpo.max_query_tokens
    return max(1, context - correction_room(cfg)) if context else 0


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
