"""Sampling from a transformers causal LM: what the hf actor backend and evaluation both call.

`generate` makes n completions per prompt with left-padded batched `model.generate` and keeps the
behaviour log-prob of every sampled token (at the sampling temperature, from the untruncated
tempered distribution); a completion ends after its first end token (any of `eos_id`: a release's
generation config may list several, as Qwen3 does). With `between_steps`, new weights
may land between decoding steps (in-flight updates: the KV cache of earlier tokens is kept, as
PipelineRL does), and each completion records the span of policy versions its tokens came from.
`sequence_logprobs` scores given completions with teacher forcing.
"""

from __future__ import annotations

from typing import Callable, Sequence

import msgspec
import torch


class Completion(msgspec.Struct):
    tokens: list[int]
    """Sampled token ids, up to and including EOS when it was sampled."""
    logprobs: list[float]
    """Behaviour log-prob of each sampled token at the sampling temperature."""
    finish_reason: str
    """'stop' (an end token sampled) or 'length' (the length cap reached)."""
    versions: tuple[int, int] | None = None
    """(first, last) policy version that sampled its tokens, under in-flight updates; None: not tracked."""


class _BetweenSteps:
    """A stopping criterion that never stops: transformers calls it after every decoding step, which is
    where in-flight weights may land. `versions[t]` is the policy version that sampled token t."""

    def __init__(self, between_steps: Callable[[], int]):
        self.between_steps = between_steps
        self.versions = [between_steps()]

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        self.versions.append(self.between_steps())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask), both (B, W) with W the longest row; rows are right-aligned."""
    width = max(len(r) for r in rows)
    # Left padding keeps every prompt's last token at the same column for batched decoding.
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids, mask


@torch.no_grad()
def generate(model, prompts: list[list[int]], n: int, *, temperature: float, max_new_tokens: int, pad_id: int,
             eos_id: int | Sequence[int], top_p: float = 1.0, device: torch.device | str = "cpu",
             between_steps: Callable[[], int] | None = None) -> list[list[Completion]]:
    """n completions for each prompt (outer list follows `prompts`); `model` must already be on `device`.

    between_steps() is called before the first and after every decoding step; it may load new
    weights into `model` in place, and returns the policy version the model holds afterwards.
    eos_id: the end token, or every end token (generation stops at whichever comes first).
    """
    from transformers import StoppingCriteriaList

    eos_ids = [int(eos_id)] if isinstance(eos_id, int) else [int(i) for i in eos_id]
    rows = [p for p in prompts for _ in range(n)]
    ids, mask = left_pad(rows, pad_id)
    width = ids.shape[1]
    hook = _BetweenSteps(between_steps) if between_steps is not None else None
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        do_sample=True,
        temperature=temperature,
        top_p=top_p,
        top_k=0,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad_id,
        eos_token_id=eos_ids,
        return_dict_in_generate=True,
        output_logits=True,
        stopping_criteria=StoppingCriteriaList([hook]) if hook else None,
    )
    seq = out.sequences[:, width:].cpu()  # (B, T)
    # Step by step: a (B, T, V) float32 copy of every step's logits would be the largest tensor of an
    # actor with a release-sized vocabulary (32 rows x 32 steps x 151,936 = 622 MB).
    logp = torch.stack([_token_logprob(step, seq[:, t], temperature) for t, step in enumerate(out.logits)], 1)  # (B, T)
    completions = [_cut(seq[i], logp[i], eos_ids, hook.versions if hook else None) for i in range(len(rows))]
    return [completions[j * n:(j + 1) * n] for j in range(len(prompts))]


def _token_logprob(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits (B, V) of one decoding step, tokens (B,) sampled there → (B,) log-prob at `temperature`."""
    scaled = logits.float().cpu() / temperature
    return scaled.gather(-1, tokens[:, None]).squeeze(-1) - scaled.logsumexp(-1)


def _cut(tokens: torch.Tensor, logp: torch.Tensor, eos_id: int | Sequence[int],
         versions: list[int] | None = None) -> Completion:
    """tokens, logp: (T,). Everything after the first end token is padding from the batch, not the
    sample. versions: (≥ T,) the policy version that sampled each token position, when tracked."""
    ends = torch.tensor([eos_id] if isinstance(eos_id, int) else list(eos_id), dtype=tokens.dtype)
    hits = torch.isin(tokens, ends).nonzero()
    end, reason = (int(hits[0]) + 1, "stop") if len(hits) else (len(tokens), "length")
    span = (versions[0], versions[end - 1]) if versions and end else None
    return Completion(tokens[:end].tolist(), logp[:end].tolist(), reason, span)


@torch.no_grad()
def sequence_logprobs(model, prompts: list[list[int]], completions: list[list[int]], pad_id: int,
                      temperature: float = 1.0, batch_size: int = 256) -> list[float]:
    """Sum over each completion's tokens of log p(token | prompt, earlier tokens), teacher-forced.

    prompts[i] and completions[i] pair up (len B each); returns B floats. Rows are left-padded as
    in `generate`, with position ids counted from each row's first real token.
    """
    device = next(model.parameters()).device
    out: list[float] = []
    for start in range(0, len(prompts), batch_size):
        ps, cs = prompts[start:start + batch_size], completions[start:start + batch_size]
        ids, mask = left_pad([p + c for p, c in zip(ps, cs)], pad_id)  # (b, W)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                       position_ids=positions.to(device)).logits[:, :-1].float().cpu() / temperature  # (b, W-1, V)
        logp = logits.gather(-1, ids[:, 1:, None]).squeeze(-1) - logits.logsumexp(-1)  # (b, W-1)
        width = ids.shape[1]
        for i, c in enumerate(cs):
            # completion token j sits at column width - len(c) + j, predicted from the column before it
            out.append(float(logp[i, width - len(c) - 1:].sum()) if c else 0.0)
    return out


def capped(c: Completion, cap: int) -> Completion:
    """`c` cut to its first `cap` tokens (finish 'length' when that removed anything): exactly the
    sample a generator stopped at `cap` would have drawn, since later tokens never influence earlier ones."""
    if len(c.tokens) <= cap:
        return c
    return Completion(c.tokens[:cap], c.logprobs[:cap], "length", c.versions)
