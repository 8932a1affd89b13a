"""Scored groups → padded training tensors."""

from __future__ import annotations

import msgspec
import torch

from streamrl.wire import ScoredGroup


class Batch(msgspec.Struct):
    """B = num_groups × G samples, right-padded to L = longest prompt + completion.

    Position t of the (B, L-1) tensors holds the log-prob of token t+1 given tokens ≤ t, so a
    completion token's behaviour log-prob sits where the model predicts it.
    """

    input_ids: torch.Tensor
    """(B, L) prompt + completion token ids, right-padded."""
    attention_mask: torch.Tensor
    """(B, L) 1 on real tokens."""
    completion_mask: torch.Tensor
    """(B, L-1) 1 where the next token is a sampled completion token."""
    behaviour_logprobs: torch.Tensor
    """(B, L-1) the actors' log-probs, aligned with completion_mask (0 elsewhere)."""
    rewards: torch.Tensor
    """(num_groups, G) rewards."""
    policy_versions: torch.Tensor
    """(num_groups,) version that generated each group."""

    @property
    def num_tokens(self) -> int:
        return int(self.completion_mask.sum())


def collate(groups: list[ScoredGroup], pad_id: int) -> Batch:
    if any(g.prompt_tokens.size == 0 for g in groups):
        raise ValueError("every group needs a prompt of at least one token (the wire rejects empty prompts)")
    rows = [(g, i) for g in groups for i in range(g.group_size)]
    lengths = [g.prompt_tokens.size + g.samples[i].num_tokens for g, i in rows]
    L = max(lengths)
    ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), L), dtype=torch.long)
    cmask = torch.zeros((len(rows), L - 1))
    blogp = torch.zeros((len(rows), L - 1))
    for r, (g, i) in enumerate(rows):
        p, toks = g.prompt_tokens.size, g.sample_tokens(i)
        n = toks.size
        ids[r, :p] = torch.from_numpy(g.prompt_tokens.astype("int64"))
        ids[r, p:p + n] = torch.from_numpy(toks.astype("int64"))
        attn[r, :p + n] = 1
        cmask[r, p - 1:p - 1 + n] = 1
        blogp[r, p - 1:p - 1 + n] = torch.from_numpy(g.sample_logprobs(i).copy())
    return Batch(
        input_ids=ids,
        attention_mask=attn,
        completion_mask=cmask,
        behaviour_logprobs=blogp,
        rewards=torch.tensor([g.rewards for g in groups], dtype=torch.float32),
        policy_versions=torch.tensor([g.policy_version for g in groups]),
    )
