"""The vllm backend's exact calls into vLLM's offline LLM, through a fake with its signatures."""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import types
from pathlib import Path

import pytest
import torch
from fakes.fake_vllm import EOS, install

from streamrl import config
from streamrl.models import model


def _build(monkeypatch, cpu: bool = True, overrides: tuple[str, ...] = ()):
    llm_cls = install(monkeypatch, cpu=cpu)
    from streamrl.actors.backends import build

    cfg = config.load(None, ["actors.backend=vllm", "actors.temperature=0.7", "actors.top_p=0.9",
                             "actors.max_new_tokens=3", "seed=5", *overrides])
    m, tok = model.build(cfg)
    return build("vllm", cfg, m, tok), llm_cls.instances[-1], tok


@pytest.fixture
def cpu_backend(monkeypatch):
    return _build(monkeypatch, cpu=True)


def test_engine_starts_from_the_saved_tiny_model_with_token_ids_and_tempered_logprobs(cpu_backend):
    _, llm, _ = cpu_backend
    kw = llm.kwargs
    assert (Path(kw["model"]) / "config.json").is_file() and list(Path(kw["model"]).glob("*.safetensors"))
    assert kw["skip_tokenizer_init"] is True and kw["dtype"] == "float32" and kw["seed"] == 5
    assert kw["logprobs_mode"] == "processed_logprobs"  # temperature applied: what the learner's ratios need
    assert kw["worker_extension_cls"] == "streamrl.actors.backends.vllm_worker.WorkerExtension"
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


@pytest.mark.parametrize("cpu", [True, False])
def test_weights_reach_every_worker_through_shared_memory_in_one_dtype_buckets_then_the_prefix_cache_resets(
        monkeypatch, cpu):
    # the same path on the CPU build and on GPUs; 2 ranks: each worker reads the whole version
    b, llm, _ = _build(monkeypatch, cpu=cpu, overrides=("actors.tensor_parallel_size=2",
                                                        "actors.update_bucket_bytes=40"))
    state = {"a.weight": torch.randn(2, 3), "b.weight": torch.arange(6.0).reshape(2, 3).t(),  # non-contiguous
             "c.weight": torch.randn(4).bfloat16()}
    state["tied.weight"] = state["a.weight"]  # tensors sharing memory
    b.load_weights(state)
    name, call = llm.calls[0]
    assert name == "collective_rpc" and call["method"] == "load_weights_from_shm"
    # only names, dtypes and shapes cross collective_rpc (msgpack): never tensor bytes
    assert call["kwargs"]["folder"] == b.weights_dir and call["kwargs"]["buckets"] == [
        [["a.weight", "float32", [2, 3]]], [["b.weight", "float32", [3, 2]]], [["c.weight", "bfloat16", [4]]],
        [["tied.weight", "float32", [2, 3]]]]
    assert llm.calls[1][0] == "reset_prefix_cache" and len(llm.calls) == 2
    for worker in llm.workers:
        (got,) = worker.model_runner.reloads
        assert list(got) == list(state) and all(torch.equal(got[k], state[k]) and got[k].dtype == state[k].dtype
                                                for k in state)
    files = {f: os.stat(os.path.join(b.weights_dir, f)).st_ino for f in os.listdir(b.weights_dir)}
    assert sorted(files) == [f"bucket-{i}" for i in range(4)]
    b.load_weights({k: v * 2 for k, v in state.items()})
    assert torch.equal(llm.workers[1].model_runner.reloads[1]["b.weight"], state["b.weight"] * 2)
    # the next version overwrites the same files (their memory is already there)
    assert files == {f: os.stat(os.path.join(b.weights_dir, f)).st_ino for f in os.listdir(b.weights_dir)}
    s = b.engine_stats()
    assert s["updates"] == 2 and s["update_mode"] == "shared_memory"


def test_a_worker_that_read_fewer_tensors_fails_the_update(cpu_backend, monkeypatch):
    b, llm, _ = cpu_backend
    monkeypatch.setattr(llm, "collective_rpc", lambda method, timeout=None, args=(), kwargs=None: [1])
    with pytest.raises(RuntimeError, match=r"the workers loaded \[1\] tensors of 2"):
        b.load_weights({"w": torch.ones(2), "v": torch.ones(3)})
    assert b.engine_stats()["updates"] == 0


def test_each_actors_engine_gets_its_own_seed(monkeypatch):
    llm_cls = install(monkeypatch)
    from streamrl.actors.backends import build

    cfg = config.load(None, ["actors.backend=vllm", "seed=5"])
    m, tok = model.build(cfg)
    for index in (0, 3):
        build("vllm", cfg, m, tok, index=index)
    assert [llm.kwargs["seed"] for llm in llm_cls.instances] == [5, 8]


def test_strict_mode_refuses_top_p_below_1_on_vllm():
    with pytest.raises(config.ConfigError, match=r"actors.top_p=0.9 with actors.backend=vllm: on_policy strict"):
        config.load(None, ["actors.backend=vllm", "on_policy=strict", "actors.top_p=0.9"])
    assert config.load(None, ["actors.backend=vllm", "actors.top_p=0.9"]).actors.top_p == 0.9  # async: allowed
    assert config.load(None, ["on_policy=strict", "actors.top_p=0.9"]).actors.top_p == 0.9  # hf: the full one


def test_a_vllm_without_logprobs_mode_is_refused(monkeypatch):
    install(monkeypatch, logprobs_mode=False)
    from streamrl.actors.backends import build

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


def test_close_shuts_the_engine_down_and_removes_the_weights_and_temporary_model_folders(cpu_backend):
    b, llm, _ = cpu_backend
    folder, model_dir = b.weights_dir, b.model_dir
    assert (Path(model_dir) / "config.json").is_file()  # the engine loaded the tiny model from it
    b.close()
    assert llm.calls[-1] == ("shutdown", {}) and not Path(folder).exists() and not Path(model_dir).exists()


def test_closing_an_engine_never_removes_a_users_model_folder(tmp_path):
    from streamrl.actors.backends import export

    (tmp_path / "config.json").write_text("{}")
    export.remove(str(tmp_path))  # not a folder hf_folder made: left alone
    assert (tmp_path / "config.json").is_file()


def test_worker_extension_streams_the_buckets_into_vllms_in_place_reload():
    from fakes.fake_vllm import Worker

    from streamrl.actors.backends import shm_weights
    from streamrl.comm.weights.collective import plan

    state = {"w": torch.arange(6.0).reshape(2, 3), "h": torch.ones(3, dtype=torch.bfloat16)}
    folder = shm_weights.new_folder()
    try:
        buckets = shm_weights.write(state, plan(state, 1 << 20), folder)
        worker = Worker()
        assert worker.load_weights_from_shm(folder, buckets) == 2
        (got,) = worker.model_runner.reloads
        assert torch.equal(got["w"], state["w"]) and got["h"].dtype == torch.bfloat16
    finally:
        shm_weights.remove(folder)


def test_config_takes_the_vllm_backend_with_inflight_updates_and_collective_sync_without_lora_or_eval_every():
    assert config.load(None, ["actors.backend=vllm"]).actors.backend == "vllm"
    assert config.load(None, ["actors.backend=vllm", "transport.weight_sync=collective"]).transport.weight_sync == \
        "collective"
    for other in ("lora.rank=8", "eval.every=5"):  # the engine's workers load a version: the actor keeps no copy
        with pytest.raises(config.ConfigError, match=f"holds no copy.*{other.split('=')[0]}"):
            config.load(None, ["actors.backend=vllm", "transport.weight_sync=collective", other])
    assert config.load(None, ["actors.backend=vllm", "actors.inflight_updates=true"]).actors.inflight_updates
    with pytest.raises(config.ConfigError, match="inflight_updates=true: on_policy strict forbids it"):
        config.load(None, ["actors.backend=vllm", "actors.inflight_updates=true", "on_policy=strict"])


def _between_steps_loading(b, at_call: int, state: dict):
    """between_steps that loads `state` as version 1 on its `at_call`-th call (the first is before any step)."""
    calls = []

    def between_steps() -> int:
        calls.append(len(calls) + 1)
        if len(calls) == at_call:
            b.load_weights(state)
        return 1 if len(calls) >= at_call else 0

    return between_steps, calls


def test_in_flight_a_new_version_pauses_with_keep_loads_labels_and_resumes_between_decoding_steps(cpu_backend):
    b, llm, _ = cpu_backend
    between_steps, calls = _between_steps_loading(b, 3, {"w": torch.ones(2)})  # after the second step
    out = b.generate([[5]], 3, between_steps)
    names = [c[0] for c in llm.calls]
    assert names == ["set_weight_version", "enqueue", "sleep", "collective_rpc", "set_weight_version", "wake_up",
                     "reset_prefix_cache"]
    assert llm.calls[0][1] == {"weight_version": "0"} and llm.calls[4][1] == {"weight_version": "1"}
    assert llm.calls[2][1] == {"level": 0, "mode": "keep"} and llm.calls[5][1] == {"tags": ["scheduling"]}
    assert llm.calls[1][1]["use_tqdm"] is False and llm.calls[1][1]["prompts"] == [{"prompt_token_ids": [5]}]
    assert len(calls) == llm.llm_engine.steps + 1  # before the first step and after every step
    # sample 0 ended at step 2 (old weights only); samples 1 and 2 sampled their third token with version 1,
    # and its log-prob is the new weights' (the fake's -0.25 per reload)
    (group,) = out
    assert [c.versions for c in group] == [(0, 0), (0, 1), (0, 1)]
    assert group[2].tokens == [105, 106, 107] and group[2].logprobs == [-0.5, -1.5, -2.75]
    assert b.engine_stats()["inflight_loads"] == 1 and not llm.paused


def test_in_flight_two_versions_landing_in_one_pause_count_as_two_loads_as_the_actor_counts_them(cpu_backend):
    b, llm, _ = cpu_backend
    calls: list[int] = []

    def between_steps() -> int:  # versions 1 and 2 both land before the call resumes
        calls.append(len(calls) + 1)
        if len(calls) == 2:
            b.load_weights({"w": torch.ones(2)})
            b.load_weights({"w": torch.ones(2) * 2})
        return 2 if len(calls) >= 2 else 0

    b.generate([[5]], 3, between_steps)
    assert [c[0] for c in llm.calls].count("sleep") == 1  # one pause
    assert b.engine_stats()["inflight_loads"] == 2 and not llm.paused


def test_in_flight_without_a_new_version_never_pauses_and_keeps_the_prefix_cache(cpu_backend):
    b, llm, _ = cpu_backend
    out = b.generate([[5], [7]], 2, lambda: 4)
    assert [c[0] for c in llm.calls] == ["set_weight_version", "enqueue"]
    assert [[c.versions for c in g] for g in out] == [[(4, 4), (4, 4)]] * 2
    b.generate([[5]], 2, lambda: 4)  # the same label: not set again
    assert [c[0] for c in llm.calls] == ["set_weight_version", "enqueue", "enqueue"]


def test_in_flight_completions_match_a_plain_generate_call_when_no_version_arrives(cpu_backend):
    b, _, _ = cpu_backend
    plain = b.generate([[5, 6], [7]], 3)
    flight = b.generate([[5, 6], [7]], 3, lambda: 0)
    assert [[(c.tokens, c.logprobs, c.finish_reason) for c in g] for g in flight] == \
        [[(c.tokens, c.logprobs, c.finish_reason) for c in g] for g in plain]
    assert all(c.versions is None for g in plain for c in g)


def test_a_failure_after_an_in_flight_load_never_leaves_the_engine_paused(cpu_backend):
    b, llm, _ = cpu_backend

    def between_steps():
        if llm.llm_engine.steps == 1:
            b.load_weights({"w": torch.ones(2)})
            raise RuntimeError("the subscriber broke")
        return 0

    with pytest.raises(RuntimeError, match="the subscriber broke"):
        b.generate([[5]], 2, between_steps)
    assert not llm.paused and llm.calls[-1][0] == "wake_up"


def test_the_rollout_passes_between_steps_to_the_vllm_backend_as_it_does_to_hf(cpu_backend):
    import inspect as _inspect

    from streamrl.actors.backends.hf import HFBackend
    from streamrl.actors.backends.vllm import VLLMBackend

    # rollout calls backend.generate(ids, n, between_steps): the third parameter must be between_steps on both
    assert list(_inspect.signature(VLLMBackend.generate).parameters)[:4] == \
        list(_inspect.signature(HFBackend.generate).parameters)[:4] == ["self", "prompts", "n", "between_steps"]


# Where vLLM is installed (the .venv-vllm of tests/integration/test_vllm_cpu.py), the fake must match it.

def test_the_fake_mirrors_the_real_llm_signatures_where_vllm_is_installed():
    real = _real_vllm()
    from fakes import fake_vllm

    for method in ("__init__", "generate", "collective_rpc", "reset_prefix_cache"):
        assert list(inspect.signature(getattr(fake_vllm.LLM, method)).parameters) == \
            list(inspect.signature(getattr(real.LLM, method)).parameters), method
    fields = set(real.SamplingParams.__struct_fields__)
    assert {f.name for f in dataclasses.fields(fake_vllm.SamplingParams)} <= fields
    assert set(fake_vllm.TokensPrompt.__annotations__) <= set(real.TokensPrompt.__annotations__)
    from vllm.engine.arg_utils import EngineArgs

    assert "logprobs_mode" in EngineArgs.__dataclass_fields__
    # the in-place reload the worker extension feeds: the Worker forwards to its model runner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.gpu_worker import Worker

    assert list(inspect.signature(fake_vllm.GPUModelRunner.reload_weights).parameters) == \
        list(inspect.signature(GPUModelRunner.reload_weights).parameters)
    assert "self.model_runner.reload_weights(*args, **kwargs)" in inspect.getsource(Worker.reload_weights)


def test_the_fakes_in_flight_parts_mirror_vllms_pause_keep_and_weight_version_api_where_vllm_is_installed():
    real = _real_vllm()
    from fakes import fake_vllm
    from vllm.outputs import CompletionOutput, WeightVersionSpan
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.engine.llm_engine import LLMEngine

    for method in ("enqueue", "sleep", "wake_up"):
        assert list(inspect.signature(getattr(fake_vllm.LLM, method)).parameters) == \
            list(inspect.signature(getattr(real.LLM, method)).parameters), method
    for method in ("step", "has_unfinished_requests", "set_weight_version"):
        assert list(inspect.signature(getattr(fake_vllm.LLMEngine, method)).parameters) == \
            list(inspect.signature(getattr(LLMEngine, method)).parameters), method
    assert [f.name for f in dataclasses.fields(fake_vllm.WeightVersionSpan)] == \
        [f.name for f in dataclasses.fields(WeightVersionSpan)]
    assert "weight_versions" in {f.name for f in dataclasses.fields(CompletionOutput)}
    # LLM.sleep(level=0, mode) is the scheduler's pause in that mode, keeping the caches; wake_up with
    # "scheduling" alone resumes it; "keep" leaves requests in the scheduler (not aborted).
    sleep = inspect.getsource(EngineCore.sleep)
    assert "self.pause_scheduler(mode=mode, clear_cache=clear_prefix_cache)" in sleep and "level >= 1" in sleep
    assert "self.resume_scheduler()" in inspect.getsource(EngineCore.wake_up)
    pause = inspect.getsource(EngineCore.pause_scheduler)
    assert 'PauseState.PAUSED_ALL if mode == "keep"' in pause
    # the engine labels each step's outputs with the weight version set last
    assert "eco.weight_version = self._weight_version" in inspect.getsource(EngineCore._attach_weight_version)


def test_the_worker_extension_shadows_no_worker_method_where_vllm_is_installed():
    _real_vllm()
    from vllm.v1.worker.gpu_worker import Worker

    from streamrl.actors.backends.vllm_worker import WorkerExtension

    # vLLM asserts the same when it mixes the extension in, but only once an engine starts.
    ours = [a for a in dir(WorkerExtension) if not a.startswith("__")]
    assert ours and not [a for a in ours if hasattr(Worker, a)]


def test_the_workers_device_the_ipc_path_opens_handles_on_is_set_by_vllm_where_installed():
    _real_vllm()
    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm.v1.worker.gpu_worker import Worker

    # load_weights_from_ipc opens the learner's buffer on `self.device`: vLLM's own IPC engine reads the same one
    assert 'self.device = torch.device(f"cuda:{visible_device_index}")' in inspect.getsource(Worker.init_device)
    assert 'self.device = torch.device("cpu")' in inspect.getsource(CPUWorker.init_device)


def _real_vllm():
    if isinstance(sys.modules.get("vllm"), types.ModuleType) and not hasattr(sys.modules["vllm"], "__file__"):
        pytest.skip("the fake vllm is installed")
    return pytest.importorskip("vllm")


def test_the_paper_and_cluster_configs_generate_with_vllm():
    repo = Path(__file__).resolve().parents[3]
    paths = [*sorted((repo / "configs" / "paper").glob("*.yaml")), repo / "configs" / "mgrpo" / "qwen2.5-math-7b.yaml",
             repo / "configs" / "cluster" / "async-8b.yaml"]
    assert len(paths) >= 12 and all(config.load(p).actors.backend == "vllm" for p in paths)


def test_a_full_shared_memory_is_a_clear_error_not_a_crash(cpu_backend, monkeypatch):
    import errno

    b, llm, _ = cpu_backend

    def full(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError, match=r"cannot hold a \d+ MiB bucket .* MiB free; .*--shm-size"):
        b.load_weights({"w": torch.ones(1 << 20)})
    # nothing reached the engine, and no file that lacks memory is left to be reused
    assert not [c for c in llm.calls if c[0] == "collective_rpc"] and os.listdir(b.weights_dir) == []


def test_an_engines_gpu_memory_share_reaches_vllm_and_is_left_to_vllm_when_unset(monkeypatch):
    _, llm, _ = _build(monkeypatch, cpu=False, overrides=("actors.gpu_memory_fraction=0.4",))
    assert llm.kwargs["gpu_memory_utilization"] == 0.4
    _, llm, _ = _build(monkeypatch, cpu=False)
    assert llm.kwargs["gpu_memory_utilization"] == 0.92  # vLLM's own default (the fake's signature is vLLM's)


def test_the_engine_backend_keeps_no_reference_to_the_actors_host_model(monkeypatch):
    """actors.main drops its host copy once the engine is up; the backend must not keep it alive."""
    import gc
    import weakref

    install(monkeypatch, cpu=False)
    from streamrl.actors.backends import build

    cfg = config.load(None, ["actors.backend=vllm"])
    m, tok = model.build(cfg)
    alive = weakref.ref(m)
    backend = build("vllm", cfg, m, tok)
    del m
    gc.collect()
    assert alive() is None and backend is not None


def test_the_fake_lora_request_and_engine_lora_switches_exist_in_the_real_vllm_where_installed():
    _real_vllm()
    from fakes import fake_vllm
    from vllm.engine.arg_utils import EngineArgs
    from vllm.lora.request import LoRARequest

    fields = getattr(LoRARequest, "__struct_fields__", None) or tuple(f.name for f in dataclasses.fields(LoRARequest))
    assert [f.name for f in dataclasses.fields(fake_vllm.LoRARequest)][:3] == list(fields)[:3]
    assert {"enable_lora", "max_lora_rank", "max_loras"} <= set(EngineArgs.__dataclass_fields__)


def test_with_lora_the_engine_starts_on_the_base_and_each_version_is_a_new_lora_request(monkeypatch):
    from safetensors.torch import load_file

    from streamrl.models import lora

    backend, llm, tok = _build(monkeypatch, overrides=("lora.rank=4", "actors.top_p=1.0"))
    kw = llm.kwargs
    assert (kw["enable_lora"], kw["max_lora_rank"], kw["max_loras"]) == (True, 8, 1)  # 4 -> vLLM's next allowed rank
    base = load_file(str(next(Path(kw["model"]).glob("*.safetensors"))))
    assert not lora.has_adapters(base) and "model.layers.0.self_attn.q_proj.weight" in base  # the plain base
    cfg = config.load(None, ["lora.rank=4"])
    m, _ = model.build(cfg)
    adapters = lora.published(m.state_dict())
    folders = []
    for version in (1, 2):
        state = {k: v + version for k, v in adapters.items()}
        backend.load_weights(state)
        req = backend.lora_request
        assert (req.lora_name, req.lora_int_id) == (f"streamrl-{version}", version)
        read, adapter_cfg = lora.read_adapter_folder(req.lora_path)
        assert adapter_cfg["r"] == 4 and adapter_cfg["peft_type"] == "LORA"
        assert set(read) == set(state) and all(torch.equal(read[k], state[k]) for k in state)
        folders.append(Path(req.lora_path))
        backend.generate([[5, 6]], 2)
        assert llm.calls[-1][1]["lora_request"] is req  # every generate call names the newest adapter
    assert not folders[0].exists() and folders[1].exists()  # the superseded version's folder is gone
    assert not any(c[0] == "collective_rpc" for c in llm.calls)  # nothing of the base reloads
    backend.close()
