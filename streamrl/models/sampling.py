"""Sampling from a causal LM (transformers', or streamrl's tiny Llama): what the hf actor backend and
evaluation both call.

`generate` makes n completions per prompt, left-padded and batched, in a lean decoding loop that
draws exactly what transformers' `model.generate` would (`generate_hf`), and keeps the
behaviour log-prob of every sampled token (at the sampling temperature, from the untruncated
tempered distribution); a completion ends after its first end token (any of `eos_id`: a release's
generation config may list several, as Qwen3 does). With `between_steps`, new weights
may land between decoding steps (in-flight updates: the KV cache of earlier tokens is kept, as
PipelineRL does), and each completion records the span of policy versions its tokens came from.
`sequence_logprobs` scores given completions with teacher forcing.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable, Sequence

import msgspec
import numpy as np
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
    # Left padding keeps every prompt's last token at the same column for batched decoding. Filled in
    # numpy and handed to torch once: a torch.tensor per row cost more than a tiny model's decoding step.
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = r
            mask[i, width - len(r):] = 1
    return torch.from_numpy(ids), torch.from_numpy(mask)


@torch.no_grad()
def generate(model, prompts: list[list[int]], n: int, *, temperature: float, max_new_tokens: int, pad_id: int,
             eos_id: int | Sequence[int], top_p: float = 1.0, device: torch.device | str = "cpu",
             between_steps: Callable[[], int] | None = None) -> list[list[Completion]]:
    """n completions for each prompt (outer list follows `prompts`); `model` must already be on `device`.

    between_steps() is called before the first and after every decoding step; it may load new
    weights into `model` in place, and returns the policy version the model holds afterwards.
    eos_id: the end token, or every end token (generation stops at whichever comes first).
    temperature 0: greedy (evaluation only; each token the most likely, its log-prob at temperature 1).

    A lean decoding loop over the model's forward with a KV cache: the same forward calls, logits
    warpers, random draws and stopping rule as transformers' `generate(do_sample=True, top_k=0)`,
    so a seed gives the same tokens and log-probs (`generate_hf`, kept as the reference, and a test
    pin that), without `generate`'s per-call set-up (generation config validation and copies,
    processor and stopping-criteria lists, output bookkeeping), which for a tiny model and a few
    tokens cost as much as the forwards themselves (`streamrl bench generate`).
    """
    new_cache = getattr(model, "new_cache", None)  # streamrl's tiny Llama brings its own (transformers-free)
    if new_cache is None and not type(model)._supports_default_dynamic_cache():  # its own cache: transformers' loop
        return generate_hf(model, prompts, n, temperature=temperature, max_new_tokens=max_new_tokens, pad_id=pad_id,
                           eos_id=eos_id, top_p=top_p, device=device, between_steps=between_steps)
    eos_ids = [int(eos_id)] if isinstance(eos_id, int) else [int(i) for i in eos_id]
    rows = [p for p in prompts for _ in range(n)]
    ids, mask = (t.to(device) for t in left_pad(rows, pad_id))
    greedy, temperature = temperature == 0, temperature or 1.0  # 0: greedy (eval), log-probs at temperature 1
    warp = _warpers(temperature, top_p)
    ends = torch.tensor(eos_ids, device=ids.device)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)  # (B, W) as generate derives them
    # generate drops an all-ones mask (no padding) so attention takes its causal fast path; so do we.
    attention = None if bool(mask.all()) else mask
    cache = new_cache() if new_cache is not None else _dynamic_cache(model)
    versions = [between_steps()] if between_steps is not None else None
    keep = _keep_one_logit(type(model))
    # The forwards and draws run under inference_mode (no autograd bookkeeping on any op: ~10% of a tiny
    # model's decoding step against no_grad); between_steps runs outside it, so whatever the weights'
    # code builds there (assembly buffers it fills in place later) stays an ordinary tensor.
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=attention, position_ids=positions, past_key_values=cache,
                    use_cache=True, **keep)
    unfinished = torch.ones(ids.shape[0], dtype=torch.long, device=ids.device)
    tokens, logps = [], []
    for t in range(max_new_tokens):
        token, logp = _draw(out, warp, greedy, temperature, unfinished, pad_id)
        tokens.append(token)
        logps.append(logp)
        with torch.inference_mode():
            unfinished = unfinished & ~torch.isin(token, ends)
        if versions is not None:
            versions.append(between_steps())
        if t == max_new_tokens - 1 or not bool(unfinished.any()):
            break
        with torch.inference_mode():
            if attention is not None:
                attention = torch.cat([attention, attention.new_ones((ids.shape[0], 1))], dim=-1)
            positions = positions[:, -1:] + 1
            out = model(input_ids=token[:, None], attention_mask=attention, position_ids=positions,
                        past_key_values=cache, use_cache=True, **keep)
    seq, logp = torch.stack(tokens, 1).cpu(), torch.stack(logps, 1)  # (B, T) each
    completions = _cut_all(seq, logp, eos_ids, versions)
    return [completions[j * n:(j + 1) * n] for j in range(len(prompts))]


def _dynamic_cache(model):
    """transformers' DynamicCache for `model`'s decoder (what `generate` makes for it)."""
    from transformers.cache_utils import DynamicCache

    return DynamicCache(config=model.config.get_text_config(decoder=True))


@torch.inference_mode()
def _draw(out, warp, greedy: bool, temperature: float, unfinished: torch.Tensor,
          pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step's tokens (B,) from the forward's last logits, as `generate` draws them (finished rows take
    padding), and their log-probs (B,) at `temperature`."""
    logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)  # (B, V)
    probs = torch.softmax(warp(logits), dim=-1)
    token = probs.argmax(-1) if greedy else torch.multinomial(probs, num_samples=1).squeeze(1)  # (B,)
    token = token * unfinished + pad_id * (1 - unfinished)
    return token, _token_logprob(logits, token.cpu(), temperature)


@functools.lru_cache(maxsize=None)
def _keep_one_logit(model_type: type) -> dict:
    """{"logits_to_keep": 1} where the model's forward takes it (generate passes it then), else {}."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model_type.forward).parameters else {}


def _warpers(temperature: float, top_p: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """The logits warpers that transformers' `generate(do_sample=True, temperature, top_p, top_k=0)`
    applies, in its order (temperature only when not 1, top-p only below 1), computed as its
    TemperatureLogitsWarper and TopPLogitsWarper (min_tokens_to_keep=1) compute them: (B, V) logits →
    (B, V) scores. Written out rather than imported: importing them imports transformers (0.8 s), which
    the tiny job's actors otherwise never need; the lean loop's test against `generate` pins them."""
    def warp(scores: torch.Tensor) -> torch.Tensor:
        if temperature != 1.0:
            scores = scores / temperature
        if top_p < 1.0:
            sorted_logits, sorted_indices = torch.sort(scores, descending=False)
            cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
            remove = cumulative <= (1 - top_p)  # the smallest tokens whose mass stays within 1 - top_p
            remove[..., -1:] = 0  # the most likely token always stays
            scores = scores.masked_fill(remove.scatter(1, sorted_indices, remove), -float("inf"))
        return scores

    return warp


@torch.no_grad()
def generate_hf(model, prompts: list[list[int]], n: int, *, temperature: float, max_new_tokens: int, pad_id: int,
                eos_id: int | Sequence[int], top_p: float = 1.0, device: torch.device | str = "cpu",
                between_steps: Callable[[], int] | None = None) -> list[list[Completion]]:
    """`generate` through transformers' `model.generate`: the reference the lean loop is checked and
    benchmarked against, and the path for models whose cache is not a DynamicCache. `model` must be a
    transformers model: for streamrl's tiny Llama pass `streamrl.models.tiny_llama.to_transformers(model)`."""
    from transformers import StoppingCriteriaList

    if not hasattr(model, "generate"):
        raise TypeError(f"generate_hf: {type(model).__name__} has no transformers `generate`; pass "
                        "streamrl.models.tiny_llama.to_transformers(model): the same weights in transformers' Llama")

    eos_ids = [int(eos_id)] if isinstance(eos_id, int) else [int(i) for i in eos_id]
    rows = [p for p in prompts for _ in range(n)]
    ids, mask = left_pad(rows, pad_id)
    width = ids.shape[1]
    greedy, temperature = temperature == 0, temperature or 1.0  # 0: greedy, log-probs at temperature 1
    hook = _BetweenSteps(between_steps) if between_steps is not None else None
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        do_sample=not greedy,
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


def _cut_all(seq: torch.Tensor, logp: torch.Tensor, eos_ids: list[int], versions: list[int] | None) -> list[Completion]:
    """`_cut` of every row of seq, logp (B, T) at once: one pass over the batch, not B small tensor calls."""
    hits = torch.isin(seq, torch.tensor(eos_ids, dtype=seq.dtype))  # (B, T)
    stopped = hits.any(-1).tolist()
    ends = torch.where(hits.any(-1), hits.int().argmax(-1) + 1, seq.shape[1]).tolist()  # first end token, inclusive
    toks, lps = seq.tolist(), logp.tolist()
    return [Completion(toks[i][:end], lps[i][:end], "stop" if stop else "length",
                       (versions[0], versions[end - 1]) if versions and end else None)
            for i, (end, stop) in enumerate(zip(ends, stopped))]


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
