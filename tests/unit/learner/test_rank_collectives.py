"""Learner ranks' collectives: tensors on the backend's device, the batch's own field list."""

from __future__ import annotations

import pytest
import torch

from streamrl.learner.batch import Batch, micro_batches
from streamrl.learner.ranks import Ranks, collective_device


def test_nccl_collectives_use_cuda_tensors_and_gloo_cpu_ones():
    assert collective_device("nccl").type == "cuda"
    assert collective_device("gloo").type == "cpu"


def test_a_tensor_on_another_device_than_the_collectives_is_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="a cpu tensor in a collective whose tensors live on cuda"):
        Ranks(2, 0, device="cuda")._broadcast(torch.zeros(3))


def test_an_empty_batch_has_every_field_at_the_shape_its_sender_announces():
    b = Batch.empty(6, 5, 3, 2)
    assert b.shape == (6, 5, 3, 2)
    assert [tuple(t.shape) for t in b.tensors()] == [(6, 5), (6, 5), (6, 4), (6, 4), (3, 2), (3,), (3, 2), (3,), (3, 2)]
    assert b.input_ids.dtype == torch.int64 and b.behaviour_logprobs.dtype == torch.float32


def test_a_share_of_groups_takes_their_samples_rows():
    b = Batch.empty(6, 5, 3, 2)
    b.input_ids.copy_(torch.arange(6)[:, None].expand(6, 5))
    b.policy_versions.copy_(torch.tensor([7, 8, 9]))
    share = b.groups(1, 3)
    assert share.shape == (4, 5, 2, 2)
    assert share.input_ids[:, 0].tolist() == [2, 3, 4, 5] and share.policy_versions.tolist() == [8, 9]


def test_micro_batches_keep_rows_times_longest_row_within_the_budget():
    lengths = [4, 7, 5, 5, 6, 4, 4, 4]
    assert micro_batches(lengths, 0) == [slice(0, 8)]
    assert micro_batches(lengths, 1) == [slice(i, i + 1) for i in range(8)]  # a row over budget goes alone
    parts = micro_batches(lengths, 16)
    assert parts == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)]
    assert all((p.stop - p.start) * max(lengths[p]) <= 16 for p in parts)
