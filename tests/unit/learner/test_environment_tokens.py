"""Environment tokens inside a completion (a multi-turn episode's tool results and turn markers): the
learner keeps them as context, gives them no loss and exactly zero gradient, and counts only the
model's tokens in every normalisation. Real parts: the wire's groups, the learner's collate, its
chunked log-probs and the loss registry's token_pg."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from streamrl.algo import losses
from streamrl.comm import codec
from streamrl.learner import logprobs
from streamrl.learner.batch import collate

V = 13
PAD = 0


def episode(prompt_id: str, prompt: list[int], turns: list[list[tuple[int, bool]]], rng: np.random.Generator,
            rewards: list[float]) -> codec.ScoredGroup:
    """A group whose sample i is turns[i]: (token, is the model's) pairs; the model's log-probs are random,
    the environment's -7 (a foreign peer's leftover: they must not matter)."""
    completions = [[t for t, _ in sample] for sample in turns]
    masks = [np.array([m for _, m in sample], dtype=bool) for sample in turns]
    lps = [(-rng.uniform(0.1, 3.0, len(c))).astype(np.float32) for c in completions]
    g = codec.ScoredGroup.make(prompt_id=prompt_id, policy_version=0, actor_id="a", prompt_tokens=prompt,
                              completions=completions, logprobs=lps, rewards=rewards,
                              finish_reasons=["stop"] * len(turns), model_token_masks=masks)
    g.behaviour_logprobs[~g.model_token_mask] = -7.0
    return g


M, E = True, False  # the model's token, the environment's


def groups(rng: np.random.Generator) -> list[codec.ScoredGroup]:
    return [
        episode("tool", [1, 2], [
            [(3, M), (4, M), (9, E), (10, E), (5, M)],   # a turn, a tool result, the answer
            [(6, M), (11, E), (7, M), (8, M)],
        ], rng, [1.0, 0.0]),
        episode("plain", [1, 2, 3], [
            [(4, M), (5, M)],
            [(12, E), (6, M), (7, M), (12, E), (8, M), (2, M)],
        ], rng, [0.25, 0.75]),
    ]


def positions_of(gs: list[codec.ScoredGroup], model: bool) -> list[tuple[int, int]]:
    """(row, position predicting the token) of every model (or environment) token, in the batch's layout."""
    out, row = [], 0
    for g in gs:
        p = g.prompt_tokens.size
        for i in range(g.group_size):
            out += [(row, p - 1 + j) for j, m in enumerate(g.sample_model_mask(i)) if bool(m) == model]
            row += 1
    return out


def hand_loss(gs, logits, adv, aggregation: str, clip: float = 0.2, is_cap: float = 2.0) -> float:
    """token_pg written out token by token over the model's tokens alone."""
    terms: list[list[float]] = []
    row = 0
    for g in gs:
        p = g.prompt_tokens.size
        for i in range(g.group_size):
            toks, beh, mask = g.sample_tokens(i), g.sample_logprobs(i), g.sample_model_mask(i)
            seq = []
            for j in range(len(toks)):
                if not mask[j]:
                    continue
                lp = float(torch.log_softmax(logits[row, p - 1 + j].double(), -1)[int(toks[j])])
                r, a = math.exp(lp - float(beh[j])), float(adv[row])
                s = min(r * a, min(max(r, 1 - clip), 1 + clip) * a)
                seq.append(-(max(s, is_cap * a) if a < 0 else s))
            terms.append(seq)
            row += 1
    if aggregation == "token":
        return sum(map(sum, terms)) / sum(map(len, terms))
    return sum(sum(t) / len(t) for t in terms) / len(terms)


def test_collate_keeps_environment_tokens_as_context_but_out_of_the_mask_and_the_token_count():
    gs = groups(np.random.default_rng(0))
    batch = collate(gs, PAD)
    assert batch.input_ids[0, :7].tolist() == [1, 2, 3, 4, 9, 10, 5]  # the tool result is in the context
    assert batch.completion_mask[0].tolist()[:7] == [0, 1, 1, 0, 0, 1, 0]
    assert batch.completion_mask[3].tolist() == [0, 0, 0, 1, 1, 0, 1, 1]
    assert batch.num_tokens == 3 + 3 + 2 + 4  # the model's tokens; the environment's 5 are not counted
    on = batch.completion_mask.bool()
    assert (batch.behaviour_logprobs[~on] == 0).all()  # the environment's -7 is gone
    assert batch.behaviour_logprobs[on].tolist() == pytest.approx(
        [float(x) for g in gs for i in range(g.group_size) for x in g.sample_logprobs(i)[g.sample_model_mask(i)]])


def test_long_rows_are_masked_the_same_way():
    rng = np.random.default_rng(1)
    n = 600  # past collate's row-loop threshold
    mask = [(7, bool(k % 5)) for k in range(n)]
    gs = [episode("long", [1, 2], [mask, [(3, M)] * n], rng, [1.0, 0.0])]
    batch = collate(gs, PAD)
    assert batch.completion_mask[0, 1:n + 1].bool().tolist() == [m for _, m in mask]
    assert batch.num_tokens == n - n // 5 + n


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_environment_tokens_get_exactly_zero_gradient_and_the_loss_is_the_model_tokens_alone(aggregation):
    torch.manual_seed(0)
    gs = groups(np.random.default_rng(2))
    batch = collate(gs, PAD)
    B, L = batch.input_ids.shape
    # The output layer's logits as the leaf: the gradient w.r.t. them is what the model's weights receive.
    logits = torch.randn(B, L, V, dtype=torch.float32, requires_grad=True)
    adv = torch.tensor([0.5, -0.5, -0.25, 0.25])
    ref = torch.randn(B, L - 1) * 0.1 - 2.0
    logp, entropy = logprobs.token_logprobs(torch.nn.Identity(), logits, batch.input_ids,
                                            batch.completion_mask.bool(), temperature=1.0, chunk_tokens=4,
                                            with_entropy=True)
    out = losses.compute("token_pg", logp, batch.behaviour_logprobs, adv, batch.completion_mask,
                         aggregation=aggregation)
    assert float(out.loss.detach()) == pytest.approx(hand_loss(gs, logits.detach(), adv, aggregation), rel=1e-5)
    full = losses.compute("token_pg", logp, batch.behaviour_logprobs, adv, batch.completion_mask,
                          aggregation=aggregation, kl_coef=0.1, ref_logprobs=ref, entropy_coef=0.01, entropy=entropy)
    full.loss.backward()
    env, model = positions_of(gs, model=False), positions_of(gs, model=True)
    assert len(env) == 5 and len(model) == batch.num_tokens
    for row, pos in env:
        assert torch.equal(logits.grad[row, pos], torch.zeros(V)), (row, pos)
    assert all(float(logits.grad[row, pos].abs().sum()) > 0 for row, pos in model)


def test_the_loss_alone_gives_environment_positions_zero_gradient_even_when_their_log_probs_are_computed():
    """The learner never computes log-probs under environment tokens; were they computed (another engine's
    path), the loss's weights still leave them exactly zero gradient, KL and entropy terms included."""
    gs = groups(np.random.default_rng(3))
    batch = collate(gs, PAD)
    B, L = batch.input_ids.shape
    logits = torch.randn(B, L, V, requires_grad=True)
    every = batch.attention_mask[:, 1:].bool().clone()  # every completion position, environment ones included
    for row, g_i in enumerate([0, 0, 1, 1]):
        every[row, :gs[g_i].prompt_tokens.size - 1] = False
    logp, entropy = logprobs.token_logprobs(torch.nn.Identity(), logits, batch.input_ids, every, temperature=1.0,
                                            chunk_tokens=64, with_entropy=True)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    out = losses.compute("token_pg", logp, batch.behaviour_logprobs, adv, batch.completion_mask, kl_coef=0.5,
                         ref_logprobs=torch.full((B, L - 1), -2.0), entropy_coef=0.1, entropy=entropy)
    out.loss.backward()
    for row, pos in positions_of(gs, model=False):
        assert torch.equal(logits.grad[row, pos], torch.zeros(V)), (row, pos)
    assert float(out.token_loss[~batch.completion_mask.bool()].abs().sum()) == 0.0
