"""The vllm backend against a real vLLM engine on GPUs: log-probs of the tempered distribution, and new
weights loaded in place from shared memory in several buckets, after which the engine's log-probs are
the new weights' (one GPU, and tensor parallel over two). Skips without CUDA or without vllm.
Not run yet: no GPU with vLLM has been available to this project."""

from __future__ import annotations

import msgspec
import pytest
import torch
from engine_checks import gap, load_over_ipc, nucleus_gap, prompts

pytestmark = pytest.mark.gpu
TEMPERATURE = 2.0
TOL = 2e-2  # GPU kernels against the reference's CPU float32


def _build(*overrides: str):
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        pytest.skip("this is vLLM's CPU build (tests/integration/test_vllm_cpu.py covers it)")
    from streamrl import config
    from streamrl.actors.backends import build
    from streamrl.models import model

    # vLLM's attention kernels want head_dim 64: hidden 128 over 2 heads. Small buckets: several per update.
    cfg = config.load(None, ["actors.backend=vllm", "model.hidden_size=128", "model.num_heads=2",
                             "actors.max_new_tokens=8", f"actors.temperature={TEMPERATURE}",
                             "actors.update_bucket_bytes=65536", *overrides])
    m, tok = model.build(cfg)
    return build("vllm", cfg, m, tok), m, tok


@pytest.mark.parametrize("tp", [1, 2])
def test_real_vllm_engine_takes_new_weights_in_place_from_shared_memory(tp):
    if torch.cuda.device_count() < tp:
        pytest.skip(f"tensor parallel over {tp} GPUs")
    backend, m, tok = _build(f"actors.tensor_parallel_size={tp}")
    try:
        ps = prompts(tok)
        first = backend.generate(ps, n=8, seed=1)
        assert gap(m, tok, ps, first, TEMPERATURE) < TOL
        old = {k: v.clone() for k, v in m.state_dict().items()}
        new = {k: v * 1.5 for k, v in old.items()}
        backend.load_weights(new)
        again = backend.generate(ps, n=8, seed=1)
        m.load_state_dict(new)
        assert gap(m, tok, ps, again, TEMPERATURE) < TOL  # the new weights' log-probs ...
        m.load_state_dict(old)
        assert gap(m, tok, ps, again, TEMPERATURE) > 0.05  # ... not the old ones'
        print(f"\nvllm gpu engine (tp {tp}):", backend.engine_stats())
    finally:
        backend.close()
        torch.cuda.empty_cache()


def test_real_vllm_engine_reports_the_nucleus_log_probs_with_top_p_below_1():
    """What the config's strict-mode refusal of top_p < 1 on vllm rests on (measured on vllm-cpu too)."""
    backend, m, tok = _build("actors.top_p=0.7")
    try:
        ps = prompts(tok)
        out = backend.generate(ps, n=8, seed=1)
        assert nucleus_gap(m, ps, out, TEMPERATURE, 0.7) < TOL < 0.05 < gap(m, tok, ps, out, TEMPERATURE)
    finally:
        backend.close()
        torch.cuda.empty_cache()


@pytest.mark.parametrize("tp", [1, 2])
def test_real_vllm_workers_take_a_version_from_the_learners_nccl_group(tp):
    """transport.weight_sync=collective: the learner's end (rank 0, this process, on the last GPU) broadcasts over
    NCCL to the engine's workers (ranks 1..tp, the first GPUs), which load it in place; then the engine's log-probs
    are the new weights'. Needs tp + 1 GPUs (NCCL refuses two ranks on one)."""
    import threading

    if torch.cuda.device_count() < tp + 1:
        pytest.skip(f"the learner's rank and {tp} engine worker(s) need {tp + 1} GPUs")
    from streamrl.commands.launch import free_ports
    from streamrl.comm.weights.collective import LearnerSync
    from streamrl.comm.weights.engine_sync import EngineSync

    torch.cuda.set_device(tp)  # the learner's rank: a GPU of its own (NCCL refuses two ranks on one device)
    backend, m, tok = _build(f"actors.tensor_parallel_size={tp}", "transport.weight_sync=collective")
    try:
        (port,) = free_ports(1)
        learner = LearnerSync("127.0.0.1", port, tp, 120, 120, 1 << 16, 120)
        old = {k: v.clone() for k, v in m.state_dict().items()}
        sync = EngineSync(lambda first, world: backend.join_weight_sync("127.0.0.1", port, first, world, 120, 120),
                          backend.receive_weight_sync, 0, 1, tp, old)
        assert sync.ready and learner.formed()
        new = {k: (v * 1.5).cuda() for k, v in old.items()}
        sent = threading.Thread(target=learner.send, args=(1, new))
        msg = learner.announcement(1, new, "L")
        sent.start()
        assert sync.receive(msg) is not None
        sent.join()
        ps = prompts(tok)
        again = backend.generate(ps, n=8, seed=1)
        m.load_state_dict({k: v.cpu() for k, v in new.items()})
        assert gap(m, tok, ps, again, TEMPERATURE) < TOL
        print(f"\nvllm gpu collective (tp {tp}):", sync.report(), learner.report())
    finally:
        backend.close()
        torch.cuda.empty_cache()


@pytest.mark.parametrize("tp", [1, 2])
def test_real_vllm_workers_open_the_learners_cuda_ipc_buffer_and_load_from_it(tp):
    """transport.weight_sync=ipc: another process (the learner's end) exports a version; each engine worker opens the
    handle on its own GPU and loads from it in place; then the engine's log-probs are the new weights'."""
    if torch.cuda.device_count() < tp:
        pytest.skip(f"tensor parallel over {tp} GPUs")
    backend, m, tok = _build(f"actors.tensor_parallel_size={tp}", "transport.weight_sync=ipc")
    try:
        new = {k: v * 1.5 for k, v in m.state_dict().items()}
        report = load_over_ipc(backend, m, new)
        ps = prompts(tok)
        again = backend.generate(ps, n=8, seed=1)
        m.load_state_dict(new)
        assert gap(m, tok, ps, again, TEMPERATURE) < TOL
        assert backend.engine_stats()["ipc_updates"] == 1
        print(f"\nvllm gpu ipc (tp {tp}):", report, backend.engine_stats())
    finally:
        backend.close()
        torch.cuda.empty_cache()
