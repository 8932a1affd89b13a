"""The sglang backend against the real SGLang Engine on a GPU: generation with log-probs and an
in-place weight update that changes them. Skips without CUDA or without sglang installed."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_real_sglang_engine_generates_and_takes_new_weights():
    pytest.importorskip("sglang")
    from actors.backends import build
    from streamrl import config, model

    # SGLang's attention kernels want head_dim 64: hidden 128 over 2 heads.
    cfg = config.load(None, ["actors.backend=sglang", "model.hidden_size=128", "model.num_heads=2",
                             "actors.max_new_tokens=4", "actors.device=cuda"])
    m, tok = model.build(cfg)
    backend = build("sglang", cfg, m, tok)
    try:
        prompt = tok("copy : a b c d =", add_special_tokens=False)["input_ids"]
        first = backend.generate([prompt], n=4)[0]
        assert all(len(c.tokens) == len(c.logprobs) and all(lp <= 1e-4 for lp in c.logprobs) for c in first)
        state = {k: v * 1.5 for k, v in m.state_dict().items()}
        backend.load_weights(state)
        assert backend.paused_s > 0
        again = backend.generate([prompt], n=4)[0]
        assert [c.logprobs for c in again] != [c.logprobs for c in first]
    finally:
        backend.close()
        torch.cuda.empty_cache()
