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
