"""The vllm backend against a real vLLM engine on a GPU: log-probs of the tempered distribution, new
weights loaded in place through the worker extension (tensors), and over an NCCL broadcast from a
"learner" rank on a second GPU. Skips without CUDA, without vllm, or (NCCL) with fewer than 2 GPUs."""

from __future__ import annotations

import threading

import pytest
import torch

pytestmark = pytest.mark.gpu
TEMPERATURE = 2.0


def _gpu_vllm():
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        pytest.skip("this is vLLM's CPU build")


def _build(*overrides: str):
    from actors.backends import build
    from streamrl import config, model

    # vLLM's attention kernels want head_dim 64: hidden 128 over 2 heads.
    cfg = config.load(None, ["actors.backend=vllm", "model.hidden_size=128", "model.num_heads=2",
                             "actors.max_new_tokens=8", f"actors.temperature={TEMPERATURE}", *overrides])
    m, tok = model.build(cfg)
    return build("vllm", cfg, m, tok), m, tok


def _gap(m, tok, prompt, completions) -> float:
    """Largest |engine's summed log-prob - teacher-forced log-prob at the sampling temperature|."""
    from streamrl import sampling

    ref = sampling.sequence_logprobs(m, [prompt] * len(completions), [c.tokens for c in completions],
                                     tok.pad_token_id, temperature=TEMPERATURE)
    return max(abs(r - sum(c.logprobs)) for r, c in zip(ref, completions))


def test_real_vllm_engine_takes_new_weights_in_place_from_tensors():
    _gpu_vllm()
    backend, m, tok = _build()
    try:
        assert backend.update_mode == "in_place"
        prompt = tok("copy : a b c d =", add_special_tokens=False)["input_ids"]
        first = backend.generate([prompt], n=8, seed=1)[0]
        assert _gap(m, tok, prompt, first) < 2e-2  # GPU kernels vs the reference's CPU float32
        state = {k: v * 1.5 for k, v in m.state_dict().items()}
        backend.load_weights(state)
        again = backend.generate([prompt], n=8, seed=1)[0]
        m.load_state_dict(state)
        assert [c.logprobs for c in again] != [c.logprobs for c in first]
        assert _gap(m, tok, prompt, again) < 2e-2
        print("\nvllm gpu engine:", backend.engine_stats())
    finally:
        backend.close()
        torch.cuda.empty_cache()


def _learner_rank(port: int, state: dict, errors: list) -> None:
    """Rank 0 of the weight group, on cuda:1: broadcasts every tensor of `state`, in order."""
    try:
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        group = StatelessProcessGroup.create(host="127.0.0.1", port=port, rank=0, world_size=2)
        comm = PyNcclCommunicator(group, device=torch.device("cuda:1"))
        for tensor in state.values():
            comm.broadcast(tensor.to("cuda:1"), src=0, stream=torch.cuda.current_stream("cuda:1"))
        torch.cuda.synchronize("cuda:1")
    except Exception as e:  # reported by the test thread
        errors.append(e)


def test_real_vllm_engine_takes_new_weights_over_an_nccl_broadcast():
    _gpu_vllm()
    if torch.cuda.device_count() < 2:
        pytest.skip("the learner rank needs a second GPU (NCCL refuses two ranks on one device)")
    from streamrl.commands.launch import free_ports

    backend, m, tok = _build()
    try:
        prompt = tok("copy : a b c d =", add_special_tokens=False)["input_ids"]
        first = backend.generate([prompt], n=8, seed=1)[0]
        state = {k: v * 1.5 for k, v in m.state_dict().items()}
        (port,), errors = free_ports(1), []
        learner = threading.Thread(target=_learner_rank, args=(port, state, errors), daemon=True)
        learner.start()
        backend.join_weight_group("127.0.0.1", port, rank_offset=1, world_size=2)
        dtypes = [str(t.dtype).removeprefix("torch.") for t in state.values()]
        backend.load_weights_from_distributed(list(state), dtypes, [list(t.shape) for t in state.values()])
        learner.join(timeout=120)
        assert not errors, errors
        again = backend.generate([prompt], n=8, seed=1)[0]
        m.load_state_dict(state)
        assert [c.logprobs for c in again] != [c.logprobs for c in first]
        assert _gap(m, tok, prompt, again) < 2e-2
    finally:
        backend.close()
        torch.cuda.empty_cache()
