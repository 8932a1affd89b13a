"""A stand-in for the `sglang` package with exactly the parts actors/backends/sglang.py uses.

Each method copies the signature of SGLang 0.5.23's offline Engine (python/sglang/srt/entrypoints/
engine.py) and its behaviour where the backend depends on it: weight updates answer
`(success, message)` and never raise, and `update_weights_from_tensor` is refused outside a
`begin_weight_update()` … `end_weight_update()` session, with SGLang's own messages
(srt/managers/scheduler_components/weight_updater.py). test_sglang_source.py checks all of this
against the released package's source. The collective calls (`init_weights_update_group`,
`update_weights_from_distributed`) form and receive on a real torch process group exactly as SGLang's
worker does (srt/utils/common.py `init_custom_process_group`; srt/model_executor/model_runner_components/
weight_updater.py `receive_weights_from_distributed`), on the one worker of a tp_size 1 engine, so the learner
end meets what a real engine would. Every call is recorded, so a test pins the exact calls and
arguments the backend makes. `install(monkeypatch)` puts it in sys.modules as `sglang`.
"""

from __future__ import annotations

import sys
import types
from typing import Optional

import torch


class LoRAUpdateOutput:
    """srt/managers/io_struct.py's answer to every LoRA load and unload (a msgspec struct there)."""

    def __init__(self, success: bool, error_message: Optional[str] = None, loaded_adapters: Optional[dict] = None):
        self.success, self.error_message, self.loaded_adapters = success, error_message, loaded_adapters


class Engine:
    instances: list["Engine"] = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls = kwargs, []
        self.session = False  # a weight-update session is open
        self.weights: dict[str, torch.Tensor] = {}  # what the model holds after the updates so far
        self.fail: dict[str, str] = {}  # method name → the message it fails with (tests set this)
        self.adapters: dict[str, dict] = {}  # LoRA: loaded adapter name → its tensors
        self.groups: dict = {}  # init_weights_update_group's process groups by name
        Engine.instances.append(self)

    def generate(self, prompt=None, sampling_params=None, input_ids=None, image_data=None, audio_data=None,
                 video_data=None, mm_hashes=None, mm_content_hashes=None, return_logprob=False,
                 logprob_start_len=None, top_logprobs_num=None, token_ids_logprob=None, lora_path=None,
                 custom_logit_processor=None, require_reasoning=False, return_hidden_states=False,
                 return_routed_experts=False, routed_experts_start_len=0, stream=False, bootstrap_host=None,
                 bootstrap_port=None, bootstrap_room=None, routed_dp_rank=None, disagg_prefill_dp_rank=None,
                 kv_hints=None, data_parallel_rank=None, external_trace_header=None, rid=None, session_params=None,
                 priority=None, session_id=None, *, cache_salt=None):
        self.calls.append(("generate", {"input_ids": input_ids, "sampling_params": sampling_params,
                                        "return_logprob": return_logprob, "lora_path": lora_path}))
        if lora_path is not None and any(p is not None and p not in self.adapters for p in lora_path):
            raise ValueError(f"The following requested LoRA adapters are not loaded: {lora_path}")
        out = []
        for i, ids in enumerate(input_ids):
            n = 1 + i % 3
            tokens = [100 + ids[-1] + k for k in range(n)]
            finish = {"type": "length", "length": n} if n == 3 else {"type": "stop", "matched": 2}
            out.append({"text": "", "output_ids": tokens,
                        "meta_info": {"output_token_logprobs": [(-0.5 - k, t, None) for k, t in enumerate(tokens)],
                                      "finish_reason": finish}})
        return out

    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                  group_name: str, backend: str = "nccl"):
        self.calls.append(("init_weights_update_group", dict(
            master_address=master_address, master_port=master_port, rank_offset=rank_offset, world_size=world_size,
            group_name=group_name, backend=backend)))
        try:  # the scheduler's worker (tp rank 0): rank = rank_offset + tp_rank
            self.groups[group_name] = init_custom_process_group(
                backend=backend, init_method=f"tcp://{master_address}:{master_port}", world_size=world_size,
                rank=rank_offset, group_name=group_name)
            return True, "Succeeded to initialize custom process group."
        except Exception as e:  # noqa: BLE001  (SGLang answers every failure as a status)
            return False, f"Failed to initialize custom process group: {e}."

    def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                        group_name: str = "weight_update_group", flush_cache: bool = True,
                                        load_format: Optional[str] = None):
        self.calls.append(("update_weights_from_distributed", dict(
            names=names, dtypes=dtypes, shapes=shapes, group_name=group_name, flush_cache=flush_cache,
            load_format=load_format)))
        if not self.session:
            return False, ("update_weights_from_distributed must run between begin_weight_update() and "
                           "end_weight_update()")
        try:
            weights = self._receive(names, dtypes, shapes, group_name, load_format)
        except Exception as e:  # noqa: BLE001
            return False, f"Failed to receive weights: {e}"
        if "update_weights_from_distributed" in self.fail:  # the load after the receive fails (SGLang's message)
            return False, self.fail["update_weights_from_distributed"]
        self.weights.update((name, t.clone()) for name, t in weights)
        return True, "Succeeded to update parameter online."

    def _receive(self, names, dtypes, shapes, group_name, load_format):
        """WeightUpdater.receive_weights_from_distributed on one worker (its device: CPU here)."""
        assert group_name in self.groups, f"Group {group_name} not in {list(self.groups)}."
        dtypes = [getattr(torch, d) for d in dtypes]
        if load_format == "flattened_bucket":  # FlattenedTensorBucket.empty, one broadcast, reconstruct_tensors
            sizes = [torch.Size(shape).numel() * d.itemsize for shape, d in zip(shapes, dtypes)]
            flat = torch.empty(sum(sizes), dtype=torch.uint8)
            torch.distributed.broadcast(flat, src=0, group=self.groups[group_name])
            return [(n, part.view(d).reshape(shape))
                    for n, d, shape, part in zip(names, dtypes, shapes, flat.split(sizes))]
        weights = [(n, torch.empty(shape, dtype=d)) for n, d, shape in zip(names, dtypes, shapes)]
        handles = [torch.distributed.broadcast(w, src=0, group=self.groups[group_name], async_op=True)
                   for _, w in weights]
        for h in handles:
            h.wait()
        return weights

    def begin_weight_update(self, selector: str = "all"):
        self.calls.append(("begin_weight_update", {"selector": selector}))
        if self.session:
            return False, "a weight-update session is already open; call end_weight_update() first"
        answer = self._answer("begin_weight_update", "Success")
        self.session = answer[0]
        return answer

    def end_weight_update(self):
        self.calls.append(("end_weight_update", {}))
        if not self.session:
            return False, "no weight-update session is open; call begin_weight_update() first"
        self.session = False
        return self._answer("end_weight_update", "Success")

    def update_weights_from_tensor(self, named_tensors, load_format: Optional[str] = None, flush_cache: bool = True):
        self.calls.append(("update_weights_from_tensor", dict(named_tensors=named_tensors, load_format=load_format,
                                                              flush_cache=flush_cache)))
        if not self.session:
            return False, "update_weights_from_tensor must run between begin_weight_update() and end_weight_update()"
        if "update_weights_from_tensor" not in self.fail:
            self.weights.update((name, t.clone()) for name, t in named_tensors)
        return self._answer("update_weights_from_tensor", "Success")

    def load_lora_adapter_from_tensors(self, lora_name: str, tensors, config_dict, load_format=None):
        self.calls.append(("load_lora_adapter_from_tensors", dict(lora_name=lora_name, tensors=tensors,
                                                                  config_dict=config_dict, load_format=load_format)))
        if not self.kwargs.get("enable_lora"):
            return LoRAUpdateOutput(success=False,
                                    error_message="LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
        if "load_lora_adapter_from_tensors" in self.fail:
            return LoRAUpdateOutput(success=False, error_message=self.fail["load_lora_adapter_from_tensors"])
        self.adapters[lora_name] = {k: v.clone() for k, v in tensors.items()}
        return LoRAUpdateOutput(success=True, loaded_adapters={k: "__tensor__" for k in self.adapters})

    def unload_lora_adapter(self, lora_name: str):
        self.calls.append(("unload_lora_adapter", dict(lora_name=lora_name)))
        if self.adapters.pop(lora_name, None) is None:
            return LoRAUpdateOutput(success=False, error_message=f"LoRA adapter {lora_name} is not loaded")
        return LoRAUpdateOutput(success=True, loaded_adapters={k: "__tensor__" for k in self.adapters})

    def shutdown(self):
        self.calls.append(("shutdown", {}))

    def _answer(self, method: str, ok: str) -> tuple[bool, str]:
        return (False, self.fail[method]) if method in self.fail else (True, ok)


def init_custom_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None,
                              group_name=None, pg_options=None, device_id=None):
    """SGLang 0.5.23's srt/utils/common.py function, as it runs with init_method given (its store path unused)."""
    from torch.distributed.distributed_c10d import (Backend, PrefixStore, _new_process_group_helper, _world,
                                                    default_pg_timeout, rendezvous)

    backend = Backend(backend) if backend else Backend("undefined")
    timeout = default_pg_timeout if timeout is None else timeout
    store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    pg, _ = _new_process_group_helper(world_size, rank, [], backend, store, group_name=group_name,
                                      backend_options=pg_options, timeout=timeout, device_id=device_id)
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def install(monkeypatch) -> type[Engine]:
    root = types.ModuleType("sglang")
    root.Engine = Engine
    monkeypatch.setitem(sys.modules, "sglang", root)
    Engine.instances.clear()
    return Engine
