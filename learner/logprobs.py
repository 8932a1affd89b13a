"""Token log-probs without full-vocabulary logits for the whole batch.

The model runs up to its last hidden state; only the positions that predict a completion token go
through the output layer, a chunk of tokens at a time (lm_head → log-softmax → gather). Under
autograd each chunk is checkpointed, so backward keeps its hidden states, not its (chunk, V) logits,
and recomputes them one chunk at a time: the full-vocabulary logits of all chunks never coexist.
"""

from __future__ import annotations

import contextlib
import inspect

import torch
from torch.utils.checkpoint import checkpoint


@contextlib.contextmanager
def returning_hidden_states(model: torch.nn.Module):
    """Within it, calling `model` (a transformers causal LM, or a DeepSpeed engine wrapping it)
    returns the decoder's last hidden state (B, L, H) instead of the model's output.

    Forward hooks rather than calling the decoder directly: the call still goes through the
    DeepSpeed engine's forward, whose bookkeeping (ZeRO-3 micro-step counting, the backward
    prologue it hooks onto the returned tensors) the micro-batched step relies on.
    """
    box: dict[str, torch.Tensor] = {}

    def keep(_module, _args, out):
        box["h"] = out[0] if isinstance(out, tuple) else out.last_hidden_state

    inner = model.get_decoder().register_forward_hook(keep)
    outer = model.register_forward_hook(lambda _m, _a, _out: box.pop("h"))
    try:
        yield
    finally:
        inner.remove()
        outer.remove()


def _keep_one_logit(model: torch.nn.Module) -> dict:
    """Ask the model to project only the last position onto the vocabulary (its output is unused)."""
    params = inspect.signature(type(model).forward).parameters
    if "logits_to_keep" in params:
        return {"logits_to_keep": 1}
    if "num_logits_to_keep" in params:  # transformers < 4.50
        return {"num_logits_to_keep": 1}
    return {}


def hidden_states(call, model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L, H) last hidden states of `model` run through `call` (the model or its DeepSpeed engine)."""
    with returning_hidden_states(model):
        return call(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **_keep_one_logit(model))


def _chunk(lm_head: torch.nn.Module, h: torch.Tensor, targets: torch.Tensor, temperature: float,
           softcap: float | None, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """h (n, H), targets (n,) → log-prob of each target (n,) and entropy (n,) (zeros without).

    A fused log-softmax over the vocabulary, then a gather: its backward is one fused kernel
    (softmax minus the one-hot), where gather-minus-logsumexp takes several (n, V) passes forward and
    back (max, subtract, exp, sum; then exp, multiply, scatter). Forward and backward of a 256-token
    chunk at the release shape's 151,936 vocabulary, fp32 on CPU: 1.5× faster than gather minus
    logsumexp after dividing by the temperature (`streamrl bench learner`, row learner_logprob_chunk).
    """
    logits = lm_head(h).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    if temperature != 1.0:  # dividing by 1 is exact: skip its (n, V) pass forward and back
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, -1)  # (n, V)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    if not with_entropy:
        return logp, torch.zeros_like(logp)
    return logp, -(logp_all.exp() * logp_all).sum(-1)


def chunk_count(tokens: int, chunk_tokens: int) -> int:
    """Output-layer calls token_logprobs makes for `tokens` positions on its own."""
    return -(-tokens // chunk_tokens)


def token_logprobs(lm_head: torch.nn.Module, h: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor, *,
                   temperature: float, chunk_tokens: int, softcap: float | None = None,
                   with_entropy: bool = False, chunks: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of token t+1 at each position t where `positions` is true, at `temperature`.

    h: (B, L, H) hidden states; input_ids: (B, L); positions: (B, L-1) bool. Returns (B, L-1)
    log-probs and entropies (None unless with_entropy), 0 where positions is false.

    chunks: how many times to call the output layer (at least chunk_count of the positions; the extra
    calls take no tokens). Under ZeRO-3 each call, and its recomputation in backward, gathers the output
    layer's weight, a collective every rank must enter: ranks pass the count they agreed on.
    """
    B, L = input_ids.shape
    rows, cols = positions.nonzero(as_tuple=True)
    hs, targets = h[rows, cols], input_ids[rows, cols + 1]  # (N, H), (N,)
    needed = chunk_count(hs.shape[0], chunk_tokens)
    calls = needed if chunks is None else chunks
    if calls < needed:
        raise ValueError(f"token_logprobs: chunks={chunks} for {hs.shape[0]} positions of {chunk_tokens} per chunk "
                         f"(at least {needed})")
    # One chunk alone gains nothing from recomputation: keep its logits for backward instead.
    recompute = torch.is_grad_enabled() and hs.requires_grad and calls > 1
    logps, ents = [], []
    for c in range(calls):
        a = c * chunk_tokens
        args = (lm_head, hs[a:a + chunk_tokens], targets[a:a + chunk_tokens], temperature, softcap, with_entropy)
        lp, ent = checkpoint(_chunk, *args, use_reentrant=False) if recompute else _chunk(*args)
        logps.append(lp)
        ents.append(ent)
    logp = h.new_zeros((B, L - 1), dtype=torch.float32)
    logp = logp.index_put((rows, cols), torch.cat(logps)) if logps else logp
    if not with_entropy:
        return logp, None
    entropy = h.new_zeros((B, L - 1), dtype=torch.float32)
    return logp, entropy.index_put((rows, cols), torch.cat(ents)) if ents else entropy
