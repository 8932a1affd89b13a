"""The sglang backend's exact calls into SGLang's offline Engine, through a fake with its signatures."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fakes.fake_sglang import install

from streamrl import config
from streamrl.actors.backends.sglang import WeightUpdateError
from streamrl.models import model


def _build(monkeypatch, *overrides: str):
    engine_cls = install(monkeypatch)
    from streamrl.actors.backends import build

    cfg = config.load(None, ["actors.backend=sglang", "actors.temperature=0.7", "actors.top_p=0.9",
                             "actors.max_new_tokens=3", *overrides])
    m, tok = model.build(cfg)
    b = build("sglang", cfg, m, tok)
    return b, engine_cls.instances[-1], tok


@pytest.fixture
def backend(monkeypatch):
    return _build(monkeypatch)


def test_engine_starts_from_the_saved_tiny_model_with_token_ids_only(backend):
    _, engine, tok = backend
    kw = engine.kwargs
    assert kw["skip_tokenizer_init"] is True and kw["tp_size"] == 1
    assert (kw["model_path"] and (__import__("pathlib").Path(kw["model_path"]) / "config.json").is_file())


def test_a_float32_model_runs_in_a_bfloat16_engine_since_sglangs_gpu_attention_takes_no_float32(backend):
    _, engine, _ = backend
    assert engine.kwargs["dtype"] == "bfloat16"  # the tiny model's config is float32


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_precision_model_keeps_its_dtype_in_the_engine(monkeypatch, dtype):
    _, engine, _ = _build(monkeypatch, f"model.dtype={dtype}")
    assert engine.kwargs["dtype"] == dtype


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


def _calls(engine) -> list[tuple[str, bool | None]]:
    return [(name, kw.get("flush_cache")) for name, kw in engine.calls]


def test_an_update_is_one_session_of_one_dtype_buckets_with_one_cache_flush_at_the_end(monkeypatch):
    b, engine, _ = _build(monkeypatch, "actors.update_bucket_bytes=40")
    state = {"a": torch.randn(2, 3), "b": torch.randn(4), "c": torch.randn(5).bfloat16(), "d": torch.randn(2)}
    b.load_weights(state)
    assert _calls(engine) == [("begin_weight_update", None), ("update_weights_from_tensor", False),
                              ("update_weights_from_tensor", False), ("update_weights_from_tensor", True),
                              ("end_weight_update", None)]
    # bounded: 24 + 16 bytes of float32 fill one bucket, the bfloat16 tensor starts the next
    sent = [[name for name, _ in kw["named_tensors"]] for name, kw in engine.calls if name == "update_weights_from_tensor"]
    assert sent == [["a", "b"], ["c"], ["d"]]
    assert set(engine.weights) == set(state) and all(torch.equal(engine.weights[k], state[k]) for k in state)
    b.load_weights(state)  # the next version opens a session of its own
    assert _calls(engine)[5:] == _calls(engine)[:5] and not engine.session
    assert b.engine_stats()["updates"] == 2 and b.engine_stats()["buckets"] == 3


@pytest.mark.parametrize("method", ["begin_weight_update", "update_weights_from_tensor", "end_weight_update"])
def test_a_refused_step_of_an_update_raises_and_leaves_no_session_open(backend, method):
    b, engine, _ = backend
    engine.fail[method] = "Failed to update parameter online: boom"
    with pytest.raises(WeightUpdateError, match=f"sglang {method}.* failed: Failed to update parameter online: boom"):
        b.load_weights({"w": torch.ones(2)})
    assert not engine.session and b.engine_stats()["updates"] == 0
    if method == "update_weights_from_tensor":  # the session was closed after the failed bucket
        assert _calls(engine)[-1] == ("end_weight_update", None)


def test_an_update_outside_a_session_is_what_sglang_refuses(backend):
    # the fake answers as SGLang 0.5 does (test_sglang_source.py pins it), so the backend's session is needed
    _, engine, _ = backend
    assert engine.update_weights_from_tensor(named_tensors=[("w", torch.ones(1))]) == (
        False, "update_weights_from_tensor must run between begin_weight_update() and end_weight_update()")


def test_an_answer_that_is_not_a_status_is_an_api_drift(backend):
    b, engine, _ = backend
    engine.begin_weight_update = lambda selector="all": None  # SGLang before 0.5 returned nothing
    with pytest.raises(WeightUpdateError, match=r"expected \(success, message\), got None"):
        b.load_weights({"w": torch.ones(2)})


def test_each_actors_engine_gets_its_own_seed(monkeypatch):
    engine_cls = install(monkeypatch)
    from streamrl.actors.backends import build

    cfg = config.load(None, ["actors.backend=sglang", "seed=5"])
    m, tok = model.build(cfg)
    for index in (0, 2):
        build("sglang", cfg, m, tok, index=index)
    assert [e.kwargs["random_seed"] for e in engine_cls.instances] == [5, 7]


def test_original_logprob_mode_is_refused(monkeypatch):
    install(monkeypatch)
    monkeypatch.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")
    from streamrl.actors.backends import build

    cfg = config.load(None, ["actors.backend=sglang"])
    with pytest.raises(RuntimeError, match="SGLANG_RETURN_ORIGINAL_LOGPROB"):
        build("sglang", cfg, *model.build(cfg))


def test_an_engines_gpu_memory_share_reaches_sglang_as_mem_fraction_static(monkeypatch):
    _, engine, _ = _build(monkeypatch, "actors.gpu_memory_fraction=0.4")
    assert engine.kwargs["mem_fraction_static"] == 0.4
    _, engine, _ = _build(monkeypatch)
    assert "mem_fraction_static" not in engine.kwargs


def test_the_engine_backend_keeps_no_reference_to_the_actors_host_model(monkeypatch):
    import gc
    import weakref

    install(monkeypatch)
    from streamrl.actors.backends import build

    cfg = config.load(None, ["actors.backend=sglang"])
    m, tok = model.build(cfg)
    alive = weakref.ref(m)
    backend = build("sglang", cfg, m, tok)
    del m
    gc.collect()
    assert alive() is None and backend is not None


def test_with_lora_each_version_is_a_new_adapter_from_tensors_named_in_every_request(monkeypatch):
    from safetensors.torch import load_file

    from streamrl.models import lora

    b, engine, _ = _build(monkeypatch, "lora.rank=4")
    kw = engine.kwargs
    assert (kw["enable_lora"], kw["max_lora_rank"], kw["max_loras_per_batch"]) == (True, 4, 1)
    base = load_file(str(next(Path(kw["model_path"]).glob("*.safetensors"))))
    assert not lora.has_adapters(base)  # the engine starts on the plain base
    m, _ = model.build(config.load(None, ["lora.rank=4"]))
    adapters = lora.published(m.state_dict())
    for version in (1, 2):
        state = {k: v + version for k, v in adapters.items()}
        b.load_weights(state)
        call = [c for c in engine.calls if c[0] == "load_lora_adapter_from_tensors"][-1][1]
        assert call["lora_name"] == f"streamrl-{version}" and call["config_dict"]["r"] == 4
        assert lora.from_peft_keys(call["tensors"]).keys() == state.keys()
        assert list(engine.adapters) == [f"streamrl-{version}"]  # the previous version was unloaded
        b.generate([[5, 6]], 2)
        assert engine.calls[-1][1]["lora_path"] == [f"streamrl-{version}"] * 2
    assert not any(c[0] == "update_weights_from_tensor" for c in engine.calls)  # nothing of the base reloads


def test_a_refused_adapter_load_stops_the_actor_with_sglangs_message(monkeypatch):
    from streamrl.models import lora

    b, engine, _ = _build(monkeypatch, "lora.rank=4")
    engine.fail["load_lora_adapter_from_tensors"] = "out of adapter memory"
    m, _ = model.build(config.load(None, ["lora.rank=4"]))
    with pytest.raises(WeightUpdateError, match="load_lora_adapter_from_tensors failed: out of adapter memory"):
        b.load_weights(lora.published(m.state_dict()))


def test_close_shuts_the_engine_down_and_removes_the_temporary_model_folder(backend):
    b, engine = backend[0], backend[1]
    model_dir = b.model_dir
    assert engine.kwargs["model_path"] == model_dir and (Path(model_dir) / "config.json").is_file()
    b.close()
    assert engine.calls[-1] == ("shutdown", {}) and not Path(model_dir).exists()
