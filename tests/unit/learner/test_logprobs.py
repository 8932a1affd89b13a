"""learner.logprobs: chunked log-probs of the completion positions equal the full-vocabulary ones, with gradients."""

from __future__ import annotations

import pytest
import torch

from streamrl.learner import logprobs


@pytest.mark.parametrize("temperature,chunk_tokens", [(1.0, 1024), (0.7, 3)])
def test_chunked_logprobs_entropy_and_gradients_equal_the_full_log_softmax(temperature, chunk_tokens):
    torch.manual_seed(0)
    B, L, H, V = 3, 6, 8, 50
    lm_head = torch.nn.Linear(H, V, bias=False)
    h = torch.randn(B, L, H, requires_grad=True)
    ids = torch.randint(0, V, (B, L))
    positions = torch.rand(B, L - 1) > 0.4
    logp, entropy = logprobs.token_logprobs(lm_head, h, ids, positions, temperature=temperature,
                                            chunk_tokens=chunk_tokens, with_entropy=True)
    (logp.sum() + entropy.sum()).backward()
    got = (h.grad.clone(), lm_head.weight.grad.clone())
    h.grad, lm_head.weight.grad = None, None

    full = lm_head(h[:, :-1]) / temperature  # (B, L-1, V): the reference materialises every position
    want = (full.gather(-1, ids[:, 1:, None]).squeeze(-1) - full.logsumexp(-1)) * positions
    p = full.softmax(-1)
    want_entropy = -(p * full.log_softmax(-1)).sum(-1) * positions
    (want.sum() + want_entropy.sum()).backward()
    assert torch.allclose(logp, want, atol=1e-5)
    assert torch.allclose(entropy, want_entropy, atol=1e-5)
    assert torch.allclose(got[0], h.grad, atol=1e-5) and torch.allclose(got[1], lm_head.weight.grad, atol=1e-5)
    assert bool((logp[~positions] == 0).all())


class _CountingHead(torch.nn.Linear):
    """An output layer that counts its calls (under ZeRO-3, each one is a gather of its weight)."""

    calls = 0

    def forward(self, x):
        type(self).calls += 1
        return super().forward(x)


@pytest.mark.parametrize("chunks", [None, 4, 6])
def test_extra_chunks_call_the_output_layer_on_no_tokens_and_change_nothing(chunks):
    g = torch.Generator().manual_seed(0)
    head = _CountingHead(8, 11, bias=False)
    h = torch.randn(2, 5, 8, generator=g, requires_grad=True)
    ids = torch.randint(0, 11, (2, 5), generator=g)
    positions = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)  # 6 tokens: 3 chunks of 2
    ref, _ = logprobs.token_logprobs(head, h, ids, positions, temperature=1.0, chunk_tokens=2)
    (grad_ref,) = torch.autograd.grad(ref.sum(), h)
    _CountingHead.calls = 0
    got, _ = logprobs.token_logprobs(head, h, ids, positions, temperature=1.0, chunk_tokens=2, chunks=chunks)
    forward_calls = _CountingHead.calls
    (grad,) = torch.autograd.grad(got.sum(), h)
    n = 3 if chunks is None else chunks
    assert forward_calls == n and _CountingHead.calls == 2 * n  # and every chunk is recomputed once in backward
    torch.testing.assert_close(got, ref, atol=0, rtol=0)
    torch.testing.assert_close(grad, grad_ref, atol=0, rtol=0)


def test_a_rank_with_no_tokens_still_calls_the_output_layer_as_often_as_agreed():
    head = _CountingHead(8, 11, bias=False)
    h = torch.randn(1, 4, 8, requires_grad=True)
    _CountingHead.calls = 0
    out, _ = logprobs.token_logprobs(head, h, torch.zeros(1, 4, dtype=torch.int64), torch.zeros(1, 3, dtype=torch.bool),
                                     temperature=1.0, chunk_tokens=2, chunks=2)
    out.sum().backward()
    assert _CountingHead.calls == 4 and float(out.detach().abs().sum()) == 0.0


def test_fewer_chunks_than_the_tokens_need_is_refused():
    with pytest.raises(ValueError, match="chunks=1 for 6 positions of 2 per chunk .at least 3."):
        logprobs.token_logprobs(torch.nn.Linear(8, 11), torch.randn(2, 5, 8), torch.zeros(2, 5, dtype=torch.int64),
                                torch.tensor([[0, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool), temperature=1.0,
                                chunk_tokens=2, chunks=1)
