"""The vllm backend's exact calls into vLLM's offline LLM, through a fake with its signatures."""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types
from pathlib import Path

import pytest
import torch
from fake_vllm import EOS, install

from streamrl import config, model


def _build(monkeypatch, cpu: bool = True, overrides: tuple[str, ...] = ()):
    llm_cls = install(monkeypatch, cpu=cpu)
    from actors.backends import build

    cfg = config.load(None, ["actors.backend=vllm", "actors.temperature=0.7", "actors.top_p=0.9",
                             "actors.max_new_tokens=3", "seed=5", *overrides])
    m, tok = model.build(cfg)
    return build("vllm", cfg, m, tok), llm_cls.instances[-1], tok


@pytest.fixture
def cpu_backend(monkeypatch):
    return _build(monkeypatch, cpu=True)


@pytest.fixture
def gpu_backend(monkeypatch):
    return _build(monkeypatch, cpu=False)


def test_engine_starts_from_the_saved_tiny_model_with_token_ids_and_tempered_logprobs(cpu_backend):
    _, llm, _ = cpu_backend
    kw = llm.kwargs
    assert (Path(kw["model"]) / "config.json").is_file() and list(Path(kw["model"]).glob("*.safetensors"))
    assert kw["skip_tokenizer_init"] is True and kw["dtype"] == "float32" and kw["seed"] == 5
    assert kw["logprobs_mode"] == "processed_logprobs"  # temperature applied: what the learner's ratios need
    assert kw["worker_extension_cls"] == "actors.backends.vllm_worker.WorkerExtension"
    assert kw["tensor_parallel_size"] == 1 and kw["enforce_eager"] is True


def test_tensor_parallel_size_reaches_the_engine_and_gpus_keep_cuda_graphs(monkeypatch):
    _, llm, _ = _build(monkeypatch, cpu=False, overrides=("actors.tensor_parallel_size=4",))
    assert llm.kwargs["tensor_parallel_size"] == 4 and llm.kwargs["enforce_eager"] is False


def test_generate_sends_each_prompt_once_with_n_samples_and_reads_the_sampled_tokens_logprob(cpu_backend):
    b, llm, tok = cpu_backend
    out = b.generate([[5, 6], [7]], n=3)
    name, call = llm.calls[-1]
    assert name == "generate" and call["use_tqdm"] is False
    assert call["prompts"] == [{"prompt_token_ids": [5, 6]}, {"prompt_token_ids": [7]}]
    p = call["sampling_params"]
    assert (p.n, p.temperature, p.top_p, p.max_tokens, p.stop_token_ids, p.logprobs, p.seed) == \
        (3, 0.7, 0.9, 3, [tok.eos_token_id], 0, None)
    assert [len(g) for g in out] == [3, 3]
    # samples come back in their index order, the sampled token's log-prob picked (never the decoy's)
    assert out[0][0].tokens == [106, EOS] and out[0][0].logprobs == [-0.5, -1.5] and out[0][0].finish_reason == "stop"
    assert out[1][2].tokens == [107, 108, 109] and out[1][2].finish_reason == "length"
    assert all(len(c.tokens) == len(c.logprobs) and -9.0 not in c.logprobs for g in out for c in g)


def test_a_seed_for_one_call_reaches_the_sampling_params(cpu_backend):
    b, llm, _ = cpu_backend
    b.generate([[5]], n=2, seed=11)
    assert llm.calls[-1][1]["sampling_params"].seed == 11


def test_on_cpu_weights_are_written_to_one_reused_folder_and_reloaded_then_the_prefix_cache_reset(cpu_backend):
    from safetensors.torch import load_file

    b, llm, _ = cpu_backend
    state = {"a.weight": torch.ones(2, 3), "b.weight": torch.arange(4.0)}
    state["tied.weight"] = state["a.weight"]  # tensors sharing memory must still save
    b.load_weights(state)
    b.load_weights({k: v * 2 for k, v in state.items()})
    rpcs = [c for c in llm.calls if c[0] == "collective_rpc"]
    assert [c[1]["method"] for c in rpcs] == ["reload_weights", "reload_weights"]
    folder = rpcs[0][1]["kwargs"]["weights_path"]
    assert rpcs[0][1]["kwargs"] == rpcs[1][1]["kwargs"] == {"weights_path": folder}
    assert [c[0] for c in llm.calls] == ["collective_rpc", "reset_prefix_cache"] * 2
    saved = load_file(str(Path(folder) / "model.safetensors"))
    assert set(saved) == set(state) and torch.equal(saved["b.weight"], torch.arange(4.0) * 2)
    assert b.engine_stats()["updates"] == 2 and b.engine_stats()["update_mode"] == "reload_from_path"


def test_on_gpu_weights_load_in_place_through_the_worker_extension_as_safetensors_bytes(gpu_backend):
    from safetensors.torch import load

    b, llm, _ = gpu_backend
    state = {"w": torch.ones(2), "v": torch.arange(6.0).reshape(2, 3).t()}  # a non-contiguous one too
    b.load_weights(state)
    name, call = llm.calls[0]
    assert name == "collective_rpc" and call["method"] == "load_weights_from_bytes" and set(call["kwargs"]) == {"data"}
    # bytes, because collective_rpc's msgpack turns a tensor in untyped kwargs into a plain list
    got = load(call["kwargs"]["data"])
    assert set(got) == {"w", "v"} and torch.equal(got["v"], state["v"])
    assert llm.calls[1][0] == "reset_prefix_cache" and b.update_mode == "in_place"


def test_nccl_weights_join_the_group_then_load_each_bucket_and_reset_the_prefix_cache(gpu_backend):
    b, llm, _ = gpu_backend
    b.join_weight_group("10.0.0.1", 29700, 1, 3)
    b.load_weights_from_distributed(["a", "b"], ["float32", "bfloat16"], [[2, 2], [4]])
    assert llm.calls[0] == ("collective_rpc", {"method": "init_weight_update_group", "args": (), "kwargs": dict(
        master_address="10.0.0.1", master_port=29700, rank_offset=1, world_size=3)})
    assert llm.calls[1] == ("collective_rpc", {"method": "update_weights_from_distributed", "args": (), "kwargs": dict(
        names=["a", "b"], dtypes=["float32", "bfloat16"], shapes=[[2, 2], [4]])})
    assert llm.calls[2][0] == "reset_prefix_cache"


def test_nccl_weights_are_refused_on_the_cpu_build(cpu_backend):
    b, _, _ = cpu_backend
    with pytest.raises(RuntimeError, match="needs vLLM on a GPU"):
        b.join_weight_group("127.0.0.1", 29700, 1, 2)


def test_a_vllm_without_logprobs_mode_is_refused(monkeypatch):
    install(monkeypatch, logprobs_mode=False)
    from actors.backends import build

    cfg = config.load(None, ["actors.backend=vllm"])
    with pytest.raises(RuntimeError, match="logprobs_mode"):
        build("vllm", cfg, *model.build(cfg))


def test_engine_stats_give_start_update_time_and_throughput_without_the_warm_up_call(cpu_backend):
    b, _, _ = cpu_backend
    b.generate([[5]], n=2)  # the warm-up call
    assert b.engine_stats()["tokens"] == 0 and b.engine_stats()["tok_per_s"] is None
    b.generate([[5]], n=3)  # 2 + 3 + 3 tokens
    b.load_weights({"w": torch.ones(1)})
    s = b.engine_stats()
    assert s["tokens"] == 8 and s["tok_per_s"] > 0 and s["start_s"] >= 0 and s["updates"] == 1 and s["update_ms"] > 0


def test_close_shuts_the_engine_down_and_removes_the_weights_folder(cpu_backend):
    b, llm, _ = cpu_backend
    folder = b.weights_dir
    b.close()
    assert llm.calls[-1] == ("shutdown", {}) and not Path(folder).exists()


class _Runner:
    def __init__(self):
        self.loaded = []

    def get_model(self):
        return types.SimpleNamespace(load_weights=lambda weights: self.loaded.extend(weights))


def test_worker_extension_loads_safetensors_bytes_on_the_workers_device_through_the_models_load_weights():
    from safetensors.torch import save

    from actors.backends.vllm_worker import WorkerExtension

    worker = types.SimpleNamespace(device=torch.device("cpu"), model_runner=_Runner())
    assert WorkerExtension.load_weights_from_bytes(worker, save({"w": torch.ones(2)})) == 1
    assert worker.model_runner.loaded[0][0] == "w" and torch.equal(worker.model_runner.loaded[0][1], torch.ones(2))


def test_worker_extension_receives_a_bucket_in_one_broadcast_then_loads_its_tensors_in_order(monkeypatch):
    from actors.backends.vllm_worker import WorkerExtension

    got = []

    class Group:
        def broadcast(self, tensor, src, stream=None):
            assert src == 0
            tensor.copy_(torch.arange(tensor.numel(), dtype=tensor.dtype))
            got.append((tuple(tensor.shape), tensor.dtype))

    monkeypatch.setattr(torch.cuda, "current_stream", lambda: None)
    worker = types.SimpleNamespace(device=torch.device("cpu"), model_runner=_Runner(), _streamrl_weight_group=Group())
    n = WorkerExtension.update_weights_from_distributed(worker, ["a", "b"], ["float32", "float32"], [[2, 2], [3]])
    assert n == 2 and got == [((7,), torch.float32)]  # never tensor by tensor
    assert [name for name, _ in worker.model_runner.loaded] == ["a", "b"]
    assert torch.equal(worker.model_runner.loaded[0][1], torch.arange(4.0).view(2, 2))
    assert torch.equal(worker.model_runner.loaded[1][1], torch.tensor([4.0, 5.0, 6.0]))
    with pytest.raises(ValueError, match="one dtype"):
        WorkerExtension.update_weights_from_distributed(worker, ["a", "b"], ["float32", "bfloat16"], [[2], [3]])


def test_config_takes_the_vllm_backend_but_not_collective_sync_or_inflight_updates():
    assert config.load(None, ["actors.backend=vllm"]).actors.backend == "vllm"
    with pytest.raises(config.ConfigError, match="collective"):
        config.load(None, ["actors.backend=vllm", "transport.weight_sync=collective"])
    with pytest.raises(config.ConfigError, match="inflight_updates"):
        config.load(None, ["actors.backend=vllm", "actors.inflight_updates=true"])


# Where vLLM is installed (the .venv-vllm of tests/integration/test_vllm_cpu.py), the fake must match it.

def test_the_fake_mirrors_the_real_llm_signatures_where_vllm_is_installed():
    real = _real_vllm()
    import fake_vllm

    for method in ("__init__", "generate", "collective_rpc", "reset_prefix_cache"):
        assert list(inspect.signature(getattr(fake_vllm.LLM, method)).parameters) == \
            list(inspect.signature(getattr(real.LLM, method)).parameters), method
    fields = set(real.SamplingParams.__struct_fields__)
    assert {f.name for f in dataclasses.fields(fake_vllm.SamplingParams)} <= fields
    assert set(fake_vllm.TokensPrompt.__annotations__) <= set(real.TokensPrompt.__annotations__)
    from vllm.engine.arg_utils import EngineArgs

    assert "logprobs_mode" in EngineArgs.__dataclass_fields__


def test_the_worker_extension_shadows_no_worker_method_where_vllm_is_installed():
    _real_vllm()
    from vllm.v1.worker.gpu_worker import Worker

    from actors.backends.vllm_worker import WorkerExtension

    # vLLM asserts the same when it mixes the extension in, but only once an engine starts.
    ours = [a for a in dir(WorkerExtension) if not a.startswith("__")]
    assert ours and not [a for a in ours if hasattr(Worker, a)]


def _real_vllm():
    if isinstance(sys.modules.get("vllm"), types.ModuleType) and not hasattr(sys.modules["vllm"], "__file__"):
        pytest.skip("the fake vllm is installed")
    return pytest.importorskip("vllm")
