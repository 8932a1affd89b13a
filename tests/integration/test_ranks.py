"""A learner over two CPU ranks (gloo): the same step as one rank, and a whole run under torchrun."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest
import torch
from procs import metrics, summary

from streamrl.commands.launch import free_ports

pytestmark = pytest.mark.slow


def _groups():
    from streamrl.wire import ScoredGroup

    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(4):
        comps = [torch.randint(4, 10, (int(torch.randint(1, 5, (1,), generator=g)),), generator=g).tolist()
                 for _ in range(8)]
        out.append(ScoredGroup.from_samples(
            prompt_id=f"p{i}", policy_version=0, actor_id="a", prompt_tokens=[4, 5, 6], completions=comps,
            logprobs=[[-1.5] * len(c) for c in comps], rewards=torch.rand(8, generator=g).tolist(),
            finish_reasons=["stop"] * 8))
    return out


def _rank(rank: int, world: int, port: int, zero: int, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from safetensors.torch import save_file

    from learner.batch import collate
    from learner.engine import Engine
    from learner.ranks import Ranks
    from streamrl import advantages, config, model

    cfg = config.load(None, ["learner.batch_groups=4", f"learner.zero_stage={zero}"])
    m, tok = model.build(cfg)
    engine = Engine(cfg, m)
    ranks = Ranks.current()
    if ranks.leader:
        batch = collate(_groups(), tok.pad_token_id)
        out, train = ranks.train_step(engine, batch, advantages.compute(batch.rewards, "grpo", 0.75))
        ranks.stop(save=False)
        save_file({"token_loss": out.token_loss.contiguous(), "ratio": out.ratio.contiguous(),
                   "loss": torch.tensor([train["loss"]])}, f"{out_dir}/out-{world}.safetensors")
    else:
        while ranks.receive(engine).kind == 1:
            pass
    state = engine.full_state_dict()
    if ranks.leader:
        save_file({k: v.contiguous() for k, v in state.items()}, f"{out_dir}/weights-{world}.safetensors")
    engine.close()


def _launch(world: int, zero: int, out_dir) -> None:
    port = free_ports(1)[0]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, world, port, zero, str(out_dir))) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
        assert p.exitcode == 0, f"rank exited with {p.exitcode}"


@pytest.mark.parametrize("zero", [0])
def test_two_ranks_take_the_same_step_as_one_rank_on_the_whole_batch(tmp_path, zero):
    from safetensors.torch import load_file

    _launch(1, zero, tmp_path)
    _launch(2, zero, tmp_path)
    from streamrl import config, model

    one, two = load_file(tmp_path / "weights-1.safetensors"), load_file(tmp_path / "weights-2.safetensors")
    initial = model.build(config.load(None))[0].state_dict()
    assert max(float((one[k] - initial[k]).abs().max()) for k in one) > 1e-5  # the step moved the weights
    for k in one:
        torch.testing.assert_close(two[k], one[k], atol=2e-6, rtol=1e-5)
    a, b = load_file(tmp_path / "out-1.safetensors"), load_file(tmp_path / "out-2.safetensors")
    torch.testing.assert_close(b["token_loss"], a["token_loss"], atol=1e-7, rtol=1e-5)
    torch.testing.assert_close(b["loss"], a["loss"], atol=1e-7, rtol=1e-5)


def test_a_run_with_a_two_rank_learner_trains_resumes_and_balances(run_job):
    run = run_job("learner.ranks=2", "learner.zero_stage=3", "learner.checkpoint_every=4", "steps=8", name="ranks")
    assert len(metrics(run)) == 8 and summary(run)["reconciliation"]["balanced"]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-8"
    run = run_job("learner.ranks=2", "learner.zero_stage=3", "learner.resume=true", "steps=12", name="ranks")
    recs = metrics(run)
    assert [r["step"] for r in recs] == list(range(12))
