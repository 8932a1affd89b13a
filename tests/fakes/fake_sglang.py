"""A stand-in for the `sglang` package with exactly the parts actors/backends/sglang.py uses.

Each method copies the signature of SGLang 0.5.23's offline Engine (python/sglang/srt/entrypoints/
engine.py) and its behaviour where the backend depends on it: weight updates answer
`(success, message)` and never raise, and `update_weights_from_tensor` is refused outside a
`begin_weight_update()` … `end_weight_update()` session, with SGLang's own messages
(srt/managers/scheduler_components/weight_updater.py). test_sglang_source.py checks all of this
against the released package's source. Every call is recorded, so a test pins the exact calls and
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


def install(monkeypatch) -> type[Engine]:
    root = types.ModuleType("sglang")
    root.Engine = Engine
    monkeypatch.setitem(sys.modules, "sglang", root)
    Engine.instances.clear()
    return Engine
