"""SGLang backend on SGLang's offline `Engine` (sglang.srt.entrypoints.engine), tested against 0.5.23.

Generation sends token ids (`skip_tokenizer_init=True`) and asks for per-token log-probs, which
SGLang reports for the distribution it sampled from (temperature applied) unless
SGLANG_RETURN_ORIGINAL_LOGPROB is set, so this backend refuses that setting.

New weights load in place between generate calls (generate blocks until its requests finish, so
none is running): one weight-update session (`begin_weight_update()` … `end_weight_update()`, which
SGLang 0.5 requires around every update and uses to restore and re-process packed weights), inside
it `update_weights_from_tensor` once per bucket of one dtype (at most `actors.update_bucket_bytes`,
so the engine never takes the whole model onto the GPU at once), and the KV cache flushed once,
with the last bucket. Each of these calls returns `(success, message)` instead of raising: a failed
one raises here (after closing the session), so an actor never stamps a new version on samples of
the old or a partly loaded set of weights.

With `transport.weight_sync=collective` the engine's workers join the learner's group through SGLang's own entry
points (`init_weights_update_group`, then per version one session of `update_weights_from_distributed` calls, one per
bucket, `load_format="flattened_bucket"`): a version goes from the learner's GPU into the engine's without passing
through this process. The group is formed and fed in SGLang's convention (streamrl/comm/weights/named_group.py); a
version that fails there comes over ZeroMQ and in tensor buckets, as above.

With `transport.weight_sync=ipc` the actor opens the learner's CUDA IPC buffer on its GPU (`receive_weight_ipc`) and
hands it to the engine in the same buckets, each a fresh copy (torch will not send on a tensor it received over IPC);
`update_weights_from_tensor` passes CUDA tensors to SGLang's workers by CUDA IPC itself. Nothing goes through host
memory; a failure leaves IPC for ZeroMQ.

With LoRA (`lora.rank` > 0) the engine starts on the plain base with `enable_lora`, and each version (the
adapters only) is loaded from memory as a new named adapter (`load_lora_adapter_from_tensors`, PEFT's tensor
names and adapter config), the previous one unloaded, and every request names the newest (`lora_path`).

Every call used here is pinned by tests against a fake with the same signatures
(tests/fakes/fake_sglang.py), checked against SGLang's released source by
tests/unit/actors/test_sglang_source.py, and written for a GPU in tests/gpu/test_sglang_engine.py.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Callable

from streamrl.actors.backends.base import BackendDefaults, Completion
import streamrl.actors.backends.export as export
from streamrl.actors.backends.specs import EngineOptions, options
from streamrl.comm.weights.collective import group_backend, plan
from streamrl.comm.weights.engine_sync import InEngine
from streamrl.comm.weights.named_group import ENGINE_GROUP
from streamrl.config import Config, LoraConfig
from streamrl.models.model import end_token_ids


class WeightUpdateError(RuntimeError):
    """SGLang refused or failed a weight update: the engine may hold a partly loaded version."""


class SGLangBackend(BackendDefaults):
    def __init__(self, cfg: Config, model, tokenizer):
        import sglang

        if os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "").lower() in ("1", "true"):
            raise RuntimeError("SGLANG_RETURN_ORIGINAL_LOGPROB is set: SGLang would report log-probs without the "
                               "sampling temperature, and the learner's importance ratios would be wrong; unset it")
        self.stop_token_ids = end_token_ids(model, tokenizer)  # every end token of the generation config
        self.end_ids = self.stop_token_ids
        self.cfg = cfg.actors
        self.opts = options(cfg.actors, EngineOptions)
        self.plan = None  # the bucket plan, made from the first version (every version has the same tensors)
        self.update_s: list[float] = []
        self.collective_updates = 0  # of update_s: versions the workers took from the collective group
        self.ipc_updates = 0  # of update_s: versions opened from the learner's CUDA IPC buffer
        self.model_dir = export.hf_folder(cfg, model, tokenizer)
        self.engine = sglang.Engine(
            model_path=self.model_dir,
            tp_size=self.opts.tensor_parallel_size,
            dtype=engine_dtype(cfg.model.dtype),
            random_seed=cfg.seed,  # this actor's own: backends.build gives each actor seed + index
            skip_tokenizer_init=True,
            log_level="error",
            **({} if self.opts.gpu_memory_fraction is None  # engines sharing a GPU: each its share
               else {"mem_fraction_static": self.opts.gpu_memory_fraction}),
            **_lora_args(cfg.lora),
        )
        self.lora = cfg.lora if cfg.lora.rank else None
        self.adapter: str | None = None  # with LoRA: the name of the newest version's adapter, in every request
        self.lora_versions = 0

    def generate(self, prompts: list[list[int]], n: int,
                 between_steps: Callable[[], int] | None = None) -> list[list[Completion]]:
        if between_steps is not None:  # the config refuses inflight_updates for sglang; a caller that skipped it
            raise ValueError("the sglang backend loads weights between generate calls only (no between_steps)")
        rows = [p for p in prompts for _ in range(n)]
        params = {"temperature": self.cfg.temperature, "top_p": self.cfg.top_p,
                  "max_new_tokens": self.cfg.max_new_tokens, "stop_token_ids": self.stop_token_ids}
        outputs = self.engine.generate(input_ids=rows, sampling_params=params, return_logprob=True,
                                       **({"lora_path": [self.adapter] * len(rows)} if self.adapter else {}))
        completions = [self._completion(o) for o in outputs]
        return [completions[j * n:(j + 1) * n] for j in range(len(prompts))]

    def eval_sampler(self, temperature: float, tokenizer):
        def sample(ids: list[list[int]], n: int, max_new_tokens: int, seed: int) -> list[list[Completion]]:
            rows = [p for p in ids for _ in range(n)]
            # sampling_seed: SGLang's per-request seed (sample i of a prompt draws with seed + i)
            params = [{"temperature": temperature, "top_p": 1.0, "max_new_tokens": max_new_tokens,
                       "stop_token_ids": self.stop_token_ids, "sampling_seed": seed + i % n} for i in range(len(rows))]
            outputs = self.engine.generate(input_ids=rows, sampling_params=params, return_logprob=True,
                                           **({"lora_path": [self.adapter] * len(rows)} if self.adapter else {}))
            completions = [self._completion(o) for o in outputs]
            return [completions[j * n:(j + 1) * n] for j in range(len(ids))]

        return sample

    @staticmethod
    def _completion(out: dict) -> Completion:
        meta = out["meta_info"]
        logprobs = [float(lp) for lp, _token, _text in meta["output_token_logprobs"]]
        finish = "length" if (meta.get("finish_reason") or {}).get("type") == "length" else "stop"
        return Completion(list(out["output_ids"]), logprobs, finish)

    def load_weights(self, state: dict) -> None:
        """state: {Hugging Face name: full tensor}. Raises WeightUpdateError when SGLang refuses a step."""
        if isinstance(state, InEngine):  # the engine took it itself (receive_weight_sync, receive_weight_ipc)
            return
        t0 = time.perf_counter()
        if self.lora is not None:
            self._load_adapter(state)
            self.update_s.append(time.perf_counter() - t0)
            return
        self._buckets(state)
        self.update_s.append(time.perf_counter() - t0)

    def receive_weight_ipc(self, msg, handle: list) -> None:
        """The version in the learner's CUDA IPC buffer (`handle`, this actor's, of the verified manifest `msg`),
        opened here on this actor's GPU and handed to the engine bucket by bucket, as `load_weights` does; raises
        WeightUpdateError when SGLang refuses a step (the actor then takes versions over ZeroMQ)."""
        import torch

        from streamrl.comm.weights import ipc

        t0 = time.perf_counter()
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        flat = ipc.provider(msg.provider).open(handle, device)
        # torch refuses to send on a CUDA tensor this process received over IPC: each bucket goes as a fresh copy (one
        # bucket's bytes on the GPU at a time), which SGLang shares with its workers by CUDA IPC in turn.
        self._buckets(dict(ipc.views(flat, msg.tensors, msg.offsets, msg.total)), copy=True)
        self.update_s.append(time.perf_counter() - t0)
        self.ipc_updates += 1

    def _buckets(self, state: dict, copy: bool = False) -> None:
        """`state` into the engine in one weight-update session, one `update_weights_from_tensor` per bucket."""
        self.plan = self.plan or plan(state, self.opts.update_bucket_bytes)
        last = len(self.plan.buckets) - 1
        with self._session():
            for i, bucket in enumerate(self.plan.buckets):
                named = [(s.name, state[s.name].clone() if copy else state[s.name]) for s in bucket]
                _check(f"update_weights_from_tensor (bucket {i + 1} of {last + 1})",
                       self.engine.update_weights_from_tensor(named_tensors=named, flush_cache=i == last))

    @contextlib.contextmanager
    def _session(self):
        """One weight-update session (SGLang 0.5 requires one around every update), closed after a failed step too,
        whose error is then the one reported."""
        _check("begin_weight_update", self.engine.begin_weight_update())
        try:
            yield
        except BaseException:
            self.engine.end_weight_update()
            raise
        _check("end_weight_update", self.engine.end_weight_update())

    def join_weight_sync(self, host: str, port: int, first_rank: int, world: int, timeout_s: float,
                         rendezvous_s: float) -> None:
        """The engine's workers join the learner's weight-sync group as ranks first_rank + their tensor-parallel rank;
        blocks until it forms. SGLang takes no timeout here: its own (torch's default) bounds the rendezvous."""
        _check("init_weights_update_group", self.engine.init_weights_update_group(
            master_address=host, master_port=port, rank_offset=first_rank, world_size=world, group_name=ENGINE_GROUP,
            backend=group_backend()))

    def receive_weight_sync(self, buckets: list) -> None:
        """The workers take the version now broadcast on the group (buckets: the announcement's TensorInfo lists), one
        `update_weights_from_distributed` call per bucket inside one weight-update session, the cache flushed with the
        last; raises WeightUpdateError when a step fails (the engine may then hold part of it: the actor asks for the
        whole version over ZeroMQ)."""
        t0 = time.perf_counter()
        with self._session():
            for i, bucket in enumerate(buckets):
                _check(f"update_weights_from_distributed (bucket {i + 1} of {len(buckets)})",
                       self.engine.update_weights_from_distributed(
                           names=[t.name for t in bucket], dtypes=[t.dtype for t in bucket],
                           shapes=[list(t.shape) for t in bucket], group_name=ENGINE_GROUP,
                           flush_cache=i == len(buckets) - 1, load_format="flattened_bucket"))
        self.update_s.append(time.perf_counter() - t0)
        self.collective_updates += 1

    def _load_adapter(self, state: dict) -> None:
        """LoRA: the version's adapters (this model's names) straight from memory as a new named adapter
        (`load_lora_adapter_from_tensors`, PEFT's tensor names and adapter config), then the previous one unloaded.
        Both answer a LoRAUpdateOutput (success, error_message) rather than raise."""
        from streamrl.models import lora

        self.lora_versions += 1
        name = f"streamrl-{self.lora_versions}"
        _check_lora("load_lora_adapter_from_tensors", self.engine.load_lora_adapter_from_tensors(
            lora_name=name, tensors=lora.peft_keys(state), config_dict=lora.adapter_config(self.lora, None)))
        previous, self.adapter = self.adapter, name
        if previous is not None:
            _check_lora("unload_lora_adapter", self.engine.unload_lora_adapter(previous))

    def engine_stats(self) -> dict:
        """Figures for the actor's stats: weight updates (count, mean and max ms)."""
        ms = [s * 1000 for s in self.update_s]
        return {"backend": "sglang", "update_mode": "tensor_buckets", "updates": len(ms),
                "collective_updates": self.collective_updates, "ipc_updates": self.ipc_updates,
                "buckets": len(self.plan.buckets) if self.plan else None,
                "update_ms": round(sum(ms) / len(ms), 1) if ms else None,
                "update_ms_max": round(max(ms), 1) if ms else None}

    def close(self) -> None:
        self.engine.shutdown()
        export.remove(self.model_dir)


def engine_dtype(model_dtype: str) -> str:
    """The dtype SGLang's engine runs in: the model's when it is bf16/fp16; bfloat16 for a float32 model.

    On an H100 SGLang picks FlashAttention-3, which takes fp16/bf16/fp8 only, so a float32 engine fails at
    start. The learner keeps its float32 master weights; each update is cast into the engine's bf16
    parameters as it loads (SGLang's weight loaders copy into the existing parameter)."""
    if model_dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"model.dtype={model_dtype!r}: the sglang backend takes float32, bfloat16 or float16")
    return "bfloat16" if model_dtype == "float32" else model_dtype


def _lora_args(lora: LoraConfig) -> dict:
    """The engine's LoRA switches (ServerArgs' lora namespace) for lora.rank > 0: one adapter per batch."""
    if not lora.rank:
        return {}
    return {"enable_lora": True, "max_lora_rank": lora.rank, "lora_target_modules": list(lora.target_modules),
            "max_loras_per_batch": 1}


def _check_lora(what: str, result) -> None:
    """SGLang's LoRA calls answer a LoRAUpdateOutput (srt/managers/io_struct.py): success and error_message."""
    if not hasattr(result, "success"):
        raise WeightUpdateError(f"sglang {what}: expected a LoRAUpdateOutput, got {result!r}; this SGLang is not "
                                "the one this backend was written for (0.5.23)")
    if not result.success:
        raise WeightUpdateError(f"sglang {what} failed: {result.error_message}; this actor stops rather than "
                                "sample from an adapter it does not hold")


def _check(what: str, result) -> None:
    """SGLang's weight calls answer (success, message); anything else is a drift of its API."""
    if not (isinstance(result, tuple) and len(result) == 2):
        raise WeightUpdateError(f"sglang {what}: expected (success, message), got {result!r}; "
                                "this SGLang is not the one this backend was written for (0.5.x)")
    success, message = result
    if not success:
        raise WeightUpdateError(f"sglang {what} failed: {message}; the engine may hold partly loaded weights, "
                                "so this actor stops rather than sample from them")
