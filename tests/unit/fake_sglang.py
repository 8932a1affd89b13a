"""A stand-in for the `sglang` package with exactly the parts actors/backends/sglang.py uses.

Each method copies the signature of SGLang's offline Engine (python/sglang/srt/entrypoints/engine.py)
and of the io_struct request types, and records every call, so a test pins the exact calls and
arguments the backend makes. `install(monkeypatch)` puts it in sys.modules as `sglang`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import types
from typing import Literal, Optional


@dataclasses.dataclass
class PauseGenerationReqInput:
    mode: Literal["abort", "retract", "in_place"] = "abort"


@dataclasses.dataclass
class ContinueGenerationReqInput:
    pass


class TokenizerManager:
    def __init__(self, calls: list):
        self.calls = calls

    async def pause_generation(self, obj: PauseGenerationReqInput):
        self.calls.append(("pause_generation", obj))

    async def continue_generation(self, obj: ContinueGenerationReqInput):
        self.calls.append(("continue_generation", obj))


class Engine:
    instances: list["Engine"] = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls = kwargs, []
        self.tokenizer_manager = TokenizerManager(self.calls)
        self.loop = asyncio.new_event_loop()
        Engine.instances.append(self)

    def generate(self, prompt=None, sampling_params=None, input_ids=None, image_data=None, audio_data=None,
                 video_data=None, mm_hashes=None, mm_content_hashes=None, return_logprob=False,
                 logprob_start_len=None, top_logprobs_num=None, token_ids_logprob=None, lora_path=None,
                 custom_logit_processor=None, require_reasoning=False, return_hidden_states=False,
                 return_routed_experts=False, routed_experts_start_len=0, stream=False, bootstrap_host=None,
                 bootstrap_port=None, bootstrap_room=None, routed_dp_rank=None, disagg_prefill_dp_rank=None,
                 data_parallel_rank=None, external_trace_header=None, rid=None, session_params=None,
                 priority=None, session_id=None, *, cache_salt=None):
        self.calls.append(("generate", {"input_ids": input_ids, "sampling_params": sampling_params,
                                        "return_logprob": return_logprob}))
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
        self.calls.append(("init_weights_update_group", dict(master_address=master_address, master_port=master_port,
                                                             rank_offset=rank_offset, world_size=world_size,
                                                             group_name=group_name, backend=backend)))

    def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                        group_name: str = "weight_update_group", flush_cache: bool = True,
                                        load_format: Optional[str] = None):
        self.calls.append(("update_weights_from_distributed", dict(names=names, dtypes=dtypes, shapes=shapes,
                                                                   group_name=group_name, flush_cache=flush_cache)))

    def update_weights_from_tensor(self, named_tensors, load_format: Optional[str] = None, flush_cache: bool = True):
        self.calls.append(("update_weights_from_tensor", dict(named_tensors=named_tensors, load_format=load_format,
                                                              flush_cache=flush_cache)))

    def shutdown(self):
        self.calls.append(("shutdown", {}))


def install(monkeypatch) -> type[Engine]:
    root = types.ModuleType("sglang")
    root.Engine = Engine
    io_struct = types.ModuleType("sglang.srt.managers.io_struct")
    io_struct.PauseGenerationReqInput = PauseGenerationReqInput
    io_struct.ContinueGenerationReqInput = ContinueGenerationReqInput
    for name, mod in [("sglang", root), ("sglang.srt", types.ModuleType("sglang.srt")),
                      ("sglang.srt.managers", types.ModuleType("sglang.srt.managers")),
                      ("sglang.srt.managers.io_struct", io_struct)]:
        monkeypatch.setitem(sys.modules, name, mod)
    Engine.instances.clear()
    return Engine
