"""The sglang backend's exact calls into SGLang's offline Engine, through a fake with its signatures."""

from __future__ import annotations

import inspect

import pytest
import torch
from fake_sglang import ContinueGenerationReqInput, PauseGenerationReqInput, install

from streamrl import config, model


@pytest.fixture
def backend(monkeypatch, tmp_path):
    engine_cls = install(monkeypatch)
    from actors.backends import build

    cfg = config.load(None, ["actors.backend=sglang", "actors.temperature=0.7", "actors.top_p=0.9",
                             "actors.max_new_tokens=3"])
    m, tok = model.build(cfg)
    b = build("sglang", cfg, m, tok)
    return b, engine_cls.instances[-1], tok


def test_engine_starts_from_the_saved_tiny_model_with_token_ids_only(backend):
    _, engine, tok = backend
    kw = engine.kwargs
    assert kw["skip_tokenizer_init"] is True and kw["tp_size"] == 1 and kw["dtype"] == "float32"
    assert (kw["model_path"] and (__import__("pathlib").Path(kw["model_path"]) / "config.json").is_file())


def test_generate_sends_ids_once_per_sample_and_reads_tokens_logprobs_and_finish(backend):
    b, engine, tok = backend
    out = b.generate([[5, 6], [7]], n=2)
    name, call = engine.calls[-1]
    assert name == "generate" and call["input_ids"] == [[5, 6], [5, 6], [7], [7]] and call["return_logprob"]
    assert call["sampling_params"] == {"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 3,
                                       "stop_token_ids": [tok.eos_token_id]}
    assert [len(g) for g in out] == [2, 2]
    assert out[0][1].tokens == [106, 107] and out[0][1].logprobs == [-0.5, -1.5] and out[0][1].finish_reason == "stop"
    assert out[1][0].finish_reason == "length"  # the fake's third row hits max_new_tokens


def test_weights_from_tensors_load_with_generation_paused_in_place(backend):
    b, engine, _ = backend
    state = {"w": torch.ones(2)}
    b.load_weights(state)
    names = [c[0] for c in engine.calls]
    assert names == ["pause_generation", "update_weights_from_tensor", "continue_generation"]
    assert engine.calls[0][1] == PauseGenerationReqInput(mode="in_place")
    assert engine.calls[2][1] == ContinueGenerationReqInput()
    assert engine.calls[1][1]["named_tensors"] == [("w", state["w"])] and engine.calls[1][1]["flush_cache"]
    assert b.paused_s > 0


def test_nccl_weights_join_the_group_then_load_each_bucket_paused(backend):
    b, engine, _ = backend
    b.join_weight_group("10.0.0.1", 29700, 1, 3, "streamrl-weights")
    b.load_weights_from_distributed(["a", "b"], ["float32", "bfloat16"], [[2, 2], [4]], "streamrl-weights")
    assert engine.calls[0] == ("init_weights_update_group", dict(
        master_address="10.0.0.1", master_port=29700, rank_offset=1, world_size=3, group_name="streamrl-weights",
        backend="nccl"))
    assert [c[0] for c in engine.calls[1:]] == ["pause_generation", "update_weights_from_distributed",
                                                "continue_generation"]
    assert engine.calls[2][1] == dict(names=["a", "b"], dtypes=["float32", "bfloat16"], shapes=[[2, 2], [4]],
                                      group_name="streamrl-weights", flush_cache=True)


def test_original_logprob_mode_is_refused(monkeypatch):
    install(monkeypatch)
    monkeypatch.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")
    from actors.backends import build

    cfg = config.load(None, ["actors.backend=sglang"])
    with pytest.raises(RuntimeError, match="SGLANG_RETURN_ORIGINAL_LOGPROB"):
        build("sglang", cfg, *model.build(cfg))


def test_the_fake_mirrors_the_real_engine_signatures_where_sglang_is_installed():
    real = pytest.importorskip("sglang").Engine
    import fake_sglang

    for method in ("generate", "init_weights_update_group", "update_weights_from_distributed",
                   "update_weights_from_tensor"):
        assert list(inspect.signature(getattr(fake_sglang.Engine, method)).parameters) == \
            list(inspect.signature(getattr(real, method)).parameters), method
