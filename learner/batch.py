"""Scored groups → padded training tensors."""

from __future__ import annotations

import msgspec
import numpy as np
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
    """(num_groups,) version that generated each group (its oldest, under in-flight updates)."""
    last_versions: torch.Tensor
    """(num_groups, G) newest version behind each sample (= policy_versions unless weights landed mid-sample)."""
    layers: torch.Tensor
    """(num_groups,) 1 for a prompt's group, 2 for a multi-layer GRPO correction group."""
    corrections: torch.Tensor
    """(num_groups, G) each sample's correction reward (multi-layer GRPO, layer 1); NaN where none."""

    @property
    def num_tokens(self) -> int:
        return int(self.completion_mask.sum())


def collate(groups: list[ScoredGroup], pad_id: int) -> Batch:
    if any(g.prompt_tokens.size == 0 for g in groups):
        raise ValueError("every group needs a prompt of at least one token (the wire rejects empty prompts)")
    B = sum(g.group_size for g in groups)
    L = max(g.prompt_tokens.size + s.num_tokens for g in groups for s in g.samples)
    # Filled in numpy and handed to torch once: per-row torch indexing cost more than the step's
    # advantage and loss math together.
    ids = np.full((B, L), pad_id, dtype=np.int64)
    attn = np.zeros((B, L), dtype=np.int64)
    cmask = np.zeros((B, L - 1), dtype=np.float32)
    blogp = np.zeros((B, L - 1), dtype=np.float32)
    row = 0
    for g in groups:
        p, offsets = g.prompt_tokens.size, g.offsets
        for i in range(g.group_size):
            a, b = offsets[i], offsets[i + 1]
            end = p + b - a
            ids[row, :p] = g.prompt_tokens
            ids[row, p:end] = g.completion_tokens[a:b]
            attn[row, :end] = 1
            cmask[row, p - 1:end - 1] = 1
            blogp[row, p - 1:end - 1] = g.behaviour_logprobs[a:b]
            row += 1
    return Batch(
        input_ids=torch.from_numpy(ids),
        attention_mask=torch.from_numpy(attn),
        completion_mask=torch.from_numpy(cmask),
        behaviour_logprobs=torch.from_numpy(blogp),
        rewards=torch.tensor([g.rewards for g in groups], dtype=torch.float32),
        policy_versions=torch.tensor([g.policy_version for g in groups]),
        last_versions=torch.tensor([g.last_versions for g in groups]),
        layers=torch.tensor([g.layer for g in groups]),
        corrections=torch.tensor([g.corrections or [float("nan")] * g.group_size for g in groups],
                                 dtype=torch.float32),
    )
