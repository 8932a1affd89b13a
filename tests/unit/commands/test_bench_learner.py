"""`streamrl bench learner`'s arithmetic: the FLOPs its MFU divides, the GPU peaks it divides by, its shape option."""

from __future__ import annotations

import inspect

import pytest
import torch

from streamrl.bench import cli, learner


def test_train_flops_count_the_decoder_over_real_tokens_and_the_output_layer_over_completions_only():
    from transformers import Qwen3ForCausalLM

    from streamrl.models.release_model import model_config

    with torch.device("meta"):
        model = Qwen3ForCausalLM(model_config("qwen3-0.6b"))
    batch = learner._batch(2, 4, (8, 16), (4, 12), 151_936)
    real, completion = int(batch.attention_mask.sum()), int(batch.completion_mask.sum())
    # Qwen3-0.6B untied: 751.6M parameters, of which 2 x 151,936 x 1,024 are the embedding and the output layer
    decoder = sum(p.numel() for p in model.parameters()) - 2 * 151_936 * 1024
    assert 440e6 < decoder < 441e6
    assert learner.train_flops(model, batch) == 6 * (decoder * real + 151_936 * 1024 * completion)
    assert real > completion > 0  # prompts count in the decoder's work, not in the output layer's


def test_a_gpu_is_matched_to_its_bf16_peak_by_name_and_the_shape_reaches_only_the_learner_bench():
    name = "NVIDIA H200"
    assert next(f for n, f in learner.PEAK_BF16_FLOPS.items() if n in name) == pytest.approx(989.4e12)
    assert "learner" in cli.OPTIONED and "shape" in inspect.signature(learner.learner).parameters
    with pytest.raises(ValueError, match="not one of"):
        learner._model(shape="qwen3-9b")
