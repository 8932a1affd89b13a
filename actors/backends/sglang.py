"""SGLang backend on SGLang's offline `Engine` (sglang.srt.entrypoints.engine).

Generation sends token ids (`skip_tokenizer_init=True`) and asks for per-token log-probs, which
SGLang reports for the distribution it sampled from (temperature applied) unless
SGLANG_RETURN_ORIGINAL_LOGPROB is set, so this backend refuses that setting. Weights arrive two
ways, each with generation paused in place (running requests keep their KV cache and resume):
  - `load_weights(state)`: tensors received over ZeroMQ → `update_weights_from_tensor`;
  - `join_weight_group` + `load_weights_from_distributed`: an NCCL broadcast from the learner →
    `init_weights_update_group` / `update_weights_from_distributed`.
Every call used here is pinned by tests against a fake with the same signatures
(tests/unit/fake_sglang.py), and exercised for real by `gpu`-marked tests where a GPU is present.
"""

from __future__ import annotations

import contextlib
import os
import time

from actors.backends.base import BACKENDS, Completion
from actors.backends.export import hf_folder


@BACKENDS.register("sglang")
class SGLangBackend:
    def __init__(self, cfg, model, tokenizer):
        import sglang

        if os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "").lower() in ("1", "true"):
            raise RuntimeError("SGLANG_RETURN_ORIGINAL_LOGPROB is set: SGLang would report log-probs without the "
                               "sampling temperature, and the learner's importance ratios would be wrong; unset it")
        self.cfg = cfg.actors
        self.eos_id = tokenizer.eos_token_id
        self.paused_s = 0.0  # total time generation was paused for weight updates
        self.engine = sglang.Engine(
            model_path=hf_folder(cfg, model, tokenizer),
            tp_size=cfg.actors.tensor_parallel_size,
            dtype=cfg.model.dtype,
            random_seed=cfg.seed,
            skip_tokenizer_init=True,
            log_level="error",
        )

    def generate(self, prompts: list[list[int]], n: int) -> list[list[Completion]]:
        rows = [p for p in prompts for _ in range(n)]
        params = {"temperature": self.cfg.temperature, "top_p": self.cfg.top_p,
                  "max_new_tokens": self.cfg.max_new_tokens, "stop_token_ids": [self.eos_id]}
        outputs = self.engine.generate(input_ids=rows, sampling_params=params, return_logprob=True)
        completions = [self._completion(o) for o in outputs]
        return [completions[j * n:(j + 1) * n] for j in range(len(prompts))]

    @staticmethod
    def _completion(out: dict) -> Completion:
        meta = out["meta_info"]
        logprobs = [float(lp) for lp, _token, _text in meta["output_token_logprobs"]]
        finish = "length" if (meta.get("finish_reason") or {}).get("type") == "length" else "stop"
        return Completion(list(out["output_ids"]), logprobs, finish)

    def load_weights(self, state: dict) -> None:
        with self._paused():
            self.engine.update_weights_from_tensor(named_tensors=list(state.items()), flush_cache=True)

    def join_weight_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                          group_name: str) -> None:
        """Join the learner's NCCL group (the learner is rank 0; this engine's workers follow rank_offset)."""
        self.engine.init_weights_update_group(master_address=master_address, master_port=master_port,
                                              rank_offset=rank_offset, world_size=world_size,
                                              group_name=group_name, backend="nccl")

    def load_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                      group_name: str) -> None:
        """Receive one broadcast bucket of tensors from the learner into the engine, in place."""
        with self._paused():
            self.engine.update_weights_from_distributed(names=names, dtypes=dtypes, shapes=shapes,
                                                        group_name=group_name, flush_cache=True)

    @contextlib.contextmanager
    def _paused(self):
        """Generation paused in place around a weight update: requests are kept, not dropped."""
        from sglang.srt.managers.io_struct import ContinueGenerationReqInput, PauseGenerationReqInput

        manager, t0 = self.engine.tokenizer_manager, time.perf_counter()
        self.engine.loop.run_until_complete(manager.pause_generation(PauseGenerationReqInput(mode="in_place")))
        try:
            yield
        finally:
            self.engine.loop.run_until_complete(manager.continue_generation(ContinueGenerationReqInput()))
            self.paused_s += time.perf_counter() - t0

    def close(self) -> None:
        self.engine.shutdown()
