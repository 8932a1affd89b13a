"""Scored groups → padded training tensors.

A completion's environment tokens (ScoredGroup.model_token_mask False: tool results, turn markers of a
multi-turn episode) go into input_ids as context but not into completion_mask, so everything that reads
the mask (the positions whose log-probs are computed, the loss and its token counts, the importance ratio
and the strict check's statistics) covers the tokens the model sampled, and those alone.
"""

from __future__ import annotations

import msgspec
import numpy as np
import torch

from streamrl.comm.codec import ScoredGroup


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
    """(B, L-1) 1 where the next token is a completion token the model sampled (0 under environment tokens)."""
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

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(B, L, num_groups, G): everything `empty` needs to make a batch of this shape."""
        return (*self.input_ids.shape, *self.rewards.shape)  # type: ignore[return-value]

    def sample_lags(self, version: int | None) -> torch.Tensor:
        """(B,) int64 versions between each sample's group (its oldest version) and learner `version`; 0 for a group
        newer than it, and every 0 when there is no version."""
        lags = (version - self.policy_versions).clamp_min(0) if version is not None else \
            torch.zeros_like(self.policy_versions)
        return lags.repeat_interleave(self.rewards.shape[1])

    def tensors(self) -> list[torch.Tensor]:
        """Every field, in declaration order (what a collective sends one by one)."""
        return [getattr(self, name) for name in self.__struct_fields__]

    @classmethod
    def empty(cls, B: int, L: int, num_groups: int, G: int, device: torch.device | str = "cpu") -> "Batch":
        """A batch of uninitialised tensors of this shape (to receive one into)."""
        sizes = {"B": B, "L": L, "L-1": L - 1, "groups": num_groups, "G": G}
        return cls(**{name: torch.empty(tuple(sizes[d] for d in dims), dtype=dtype, device=device)
                      for name, (dims, dtype) in _LAYOUT.items()})

    def groups(self, start: int, stop: int) -> "Batch":
        """Groups start..stop-1 and their samples (views, no copy)."""
        G = self.rewards.shape[1]
        return Batch(**{name: getattr(self, name)[start * G:stop * G] if dims[0] == "B" else getattr(self, name)[start:stop]
                        for name, (dims, _) in _LAYOUT.items()})


# Each field's dimensions and dtype; the first dimension says whether it has a row per sample (B)
# or per group.
_LAYOUT: dict[str, tuple[tuple[str, ...], torch.dtype]] = {
    "input_ids": (("B", "L"), torch.int64),
    "attention_mask": (("B", "L"), torch.int64),
    "completion_mask": (("B", "L-1"), torch.float32),
    "behaviour_logprobs": (("B", "L-1"), torch.float32),
    "rewards": (("groups", "G"), torch.float32),
    "policy_versions": (("groups",), torch.int64),
    "last_versions": (("groups", "G"), torch.int64),
    "layers": (("groups",), torch.int64),
    "corrections": (("groups", "G"), torch.float32),
}
assert tuple(_LAYOUT) == Batch.__struct_fields__, "every Batch field needs its layout"


def micro_batches(lengths: list[int], budget: int) -> list[slice]:
    """Consecutive row ranges whose padded size (rows × longest row) stays within `budget` tokens.

    lengths: (B,) each row's real length. A row longer than the budget goes alone; budget 0 means
    one range of every row.
    """
    if not budget:
        return [slice(0, len(lengths))]
    out, start, longest = [], 0, 0
    for i, n in enumerate(lengths):
        if i > start and (i - start + 1) * max(longest, n) > budget:
            out.append(slice(start, i))
            start, longest = i, 0
        longest = max(longest, n)
    out.append(slice(start, len(lengths)))
    return out


# Above this many tokens per row on average, a slice copy per row beats masked writes (which touch
# every cell of the (B, L) arrays); below it, the per-row Python overhead dominates. Measured on
# 16 groups × 8 samples: masks 2-3× faster at 4-64 tokens per row, 2-3× slower at 512.
_ROW_LOOP_MIN_TOKENS = 256


def collate(groups: list[ScoredGroup], pad_id: int) -> Batch:
    """Pad `groups` into a Batch of B = sum of group sizes rows, L = longest prompt + completion."""
    if any(g.prompt_tokens.size == 0 for g in groups):
        raise ValueError("every group needs a prompt of at least one token (the wire rejects empty prompts)")
    sizes = [g.group_size for g in groups]
    plen = np.repeat([g.prompt_tokens.size for g in groups], sizes)[:, None]            # (B, 1) prompt lengths
    end = plen + np.array([s.num_tokens for g in groups for s in g.samples])[:, None]  # (B, 1) sequence lengths
    B, L = len(plen), int(end.max())
    # Filled in numpy and handed to torch once: per-row torch indexing cost more than the step's
    # advantage and loss math together.
    ids = np.full((B, L), pad_id, dtype=np.int64)
    attn = (np.arange(L) < end).astype(np.int64)
    cmask = np.zeros((B, L - 1), dtype=np.float32)
    blogp = np.zeros((B, L - 1), dtype=np.float32)
    fill = _fill_rows if end.mean() >= _ROW_LOOP_MIN_TOKENS else _fill_masked
    fill(groups, plen, end, ids, cmask, blogp)
    if any(g.model_token_mask is not None for g in groups):
        _mask_environment(groups, plen, end, cmask, blogp)
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


def _fill_masked(groups, plen, end, ids, cmask, blogp) -> None:
    """Boolean masks mark where prompts and completions go, and one masked write per array places
    every token (a mask enumerates its cells row by row: the order the groups' flat arrays have)."""
    col = np.arange(ids.shape[1])
    in_completion = (col >= plen) & (col < end)  # (B, L)
    predicts = np.ascontiguousarray(in_completion[:, 1:])  # (B, L-1): position t predicts completion token t+1
    ids[col < plen] = np.concatenate([np.tile(g.prompt_tokens, g.group_size) for g in groups])
    ids[in_completion] = np.concatenate([g.completion_tokens for g in groups])
    cmask[predicts] = 1
    blogp[predicts] = np.concatenate([g.behaviour_logprobs for g in groups])


def _fill_rows(groups, plen, end, ids, cmask, blogp) -> None:
    """Long rows: one slice copy per row and array (each prompt broadcast once per group)."""
    row = 0
    for g in groups:
        p, offsets, k = g.prompt_tokens.size, g.offsets, g.group_size
        ids[row:row + k, :p] = g.prompt_tokens
        for i in range(k):
            a, b = offsets[i], offsets[i + 1]
            ids[row, p:p + b - a] = g.completion_tokens[a:b]
            cmask[row, p - 1:p + b - a - 1] = 1
            blogp[row, p - 1:p + b - a - 1] = g.behaviour_logprobs[a:b]
            row += 1


def _mask_environment(groups, plen, end, cmask, blogp) -> None:
    """Zero completion_mask and the behaviour log-probs where the next token is an environment token."""
    col = np.arange(cmask.shape[1] + 1)
    predicts = np.ascontiguousarray(((col >= plen) & (col < end))[:, 1:])  # (B, L-1), as _fill_masked's
    model = np.concatenate([g.model_token_mask if g.model_token_mask is not None
                            else np.ones(g.completion_tokens.size, dtype=bool) for g in groups])
    cmask[predicts] = model
    blogp *= cmask
