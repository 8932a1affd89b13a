"""Two learner ranks at ZeRO-3 whose shares of a batch differ in length: one rank has more micro-batches
and more log-prob chunks than the other. Under ZeRO-3 every forward (and each call of the output layer
per log-prob chunk, and its recomputation in backward) gathers parameters, a collective both ranks must
enter; the persistence threshold at 0 makes every parameter gathered (the tiny model's are all below
DeepSpeed's default threshold, which hides the case). The step must finish, and equal the one a single
rank takes on the whole batch."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest
import torch

from streamrl.commands.launch import free_ports

pytestmark = pytest.mark.slow

# Rank 0 gets groups 0-1 (completions of 12 tokens), rank 1 groups 2-3 (1 token). With 30 padded tokens per
# micro-batch and log-prob chunks of 5 tokens, rank 0 runs 8 micro-batches of 5 chunks, rank 1 3 of 2.
LONG, SHORT, BUDGET, CHUNK = 12, 1, 30, 5


def _groups():
    from streamrl.comm.codec import ScoredGroup

    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(4):
        n = LONG if i < 2 else SHORT
        comps = [torch.randint(4, 10, (n,), generator=g).tolist() for _ in range(8)]
        out.append(ScoredGroup.from_samples(
            prompt_id=f"p{i}", policy_version=0, actor_id="a", prompt_tokens=[4, 5, 6], completions=comps,
            logprobs=[[-1.5] * n for _ in comps], rewards=torch.rand(8, generator=g).tolist(),
            finish_reasons=["stop"] * 8))
    return out


def _rank(rank: int, world: int, port: int, zero: int, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from safetensors.torch import save_file

    from streamrl import config
    from streamrl.algo import advantages
    from streamrl.learner.batch import collate
    from streamrl.learner.engine import Engine
    from streamrl.learner.ranks import Ranks
    from streamrl.models import model

    budget = BUDGET if world > 1 else 0
    cfg = config.load(None, ["learner.batch_groups=4", f"learner.zero_stage={zero}", "learner.zero3_persistence_threshold=0",
                             f"learner.micro_batch_tokens={budget}", f"learner.logprob_chunk_tokens={CHUNK}",
                             "learner.collective_timeout_s=60"])
    m, tok = model.build(cfg)
    engine = Engine(cfg, m)
    ranks = Ranks.current()
    batch = collate(_groups(), tok.pad_token_id)
    if ranks.leader:
        out, train = ranks.train_step(engine, batch, advantages.compute(batch.rewards, "grpo", 0.75))
        ranks.stop(save=False)
    else:
        while ranks.receive(engine).kind == 1:
            pass
    state = engine.full_state_dict()
    if ranks.leader:
        save_file({"token_loss": out.token_loss.contiguous(), "micro_batches": torch.tensor([train["micro_batches"]]),
                   **{k: v.contiguous() for k, v in state.items()}}, f"{out_dir}/world{world}.safetensors")
    engine.close()
    os._exit(0)  # see test_ranks._zero3_rank: the results are written; ZeRO-3's teardown can abort


def _run(world: int, zero: int, out_dir) -> list[mp.Process]:
    port = free_ports(1)[0]
    procs = [mp.get_context("spawn").Process(target=_rank, args=(r, world, port, zero, str(out_dir)))
             for r in range(world)]
    for p in procs:
        p.start()
    return procs


@pytest.mark.long
def test_zero3_ranks_with_unequal_micro_batch_and_chunk_counts_take_the_one_rank_step(tmp_path):
    from safetensors.torch import load_file

    procs = _run(1, 0, tmp_path) + _run(2, 3, tmp_path)
    try:
        for p in procs:
            p.join(300)
        assert [p.exitcode for p in procs] == [0, 0, 0]
    finally:
        for p in procs:
            if p.exitcode is None:
                p.kill()
    one, two = load_file(tmp_path / "world1.safetensors"), load_file(tmp_path / "world2.safetensors")
    assert int(one["micro_batches"]) == 1 and int(two["micro_batches"]) == 8  # rank 0's own count
    torch.testing.assert_close(two["token_loss"], one["token_loss"], atol=1e-7, rtol=1e-5)
    from streamrl import config
    from streamrl.models import model

    initial = model.build(config.load(None))[0].state_dict()
    weights = [k for k in one if k not in ("token_loss", "micro_batches")]
    assert max(float((one[k] - initial[k]).abs().max()) for k in weights) > 1e-5  # the step moved the weights
    for k in weights:  # AdamW's first step amplifies rounding near eps: relative to the update, loosely
        assert float((two[k] - one[k]).norm() / (one[k] - initial[k]).norm().clamp_min(1e-30)) < 1e-3, k
