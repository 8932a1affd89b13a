"""LoRA on the DeepSpeed learner at every ZeRO stage (CPU, gloo; two ranks where ZeRO shards): two steps
move the adapters and leave the frozen base bit for bit, a version carries the adapters only, the base may be
bf16 while the adapters stay fp32, and a checkpoint (without the base) resumes to the same adapters."""

from __future__ import annotations

import json
import multiprocessing as mp
import os

import pytest
import torch
from test_ranks import _groups

from streamrl.commands.launch import free_ports

pytestmark = pytest.mark.slow


def _rank(rank: int, world: int, port: int, zero: int, dtype: str, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from streamrl import config
    from streamrl.algo import advantages
    from streamrl.learner.batch import collate
    from streamrl.learner.engine import Engine
    from streamrl.learner.ranks import Ranks
    from streamrl.models import lora, model

    cfg = config.load(None, ["learner.batch_groups=4", f"learner.zero_stage={zero}", f"model.dtype={dtype}",
                             "lora.rank=4", "optim.lr=1e-2"])
    m, tok = model.build(cfg)
    before = {k: v.detach().clone() for k, v in m.state_dict().items()}
    engine = Engine(cfg, m)
    ranks = Ranks.current()
    batch = collate(_groups(), tok.pad_token_id)
    adv = advantages.compute(batch.rewards, "grpo", 0.75)
    for _ in range(2):
        if ranks.leader:
            ranks.train_step(engine, batch, adv)
        else:
            ranks.receive(engine)
    if ranks.leader:
        ranks.stop(save=False)
    else:
        ranks.receive(engine)
    published = engine.published_state()
    state = engine.full_state_dict()
    ckpt = os.path.join(out_dir, "ckpt")
    engine.save(ckpt, "t")
    # a fresh engine from the same config, its adapters reinitialised, resumes the saved ones
    m2, _ = model.build(config.load(None, ["learner.batch_groups=4", f"learner.zero_stage={zero}",
                                           f"model.dtype={dtype}", "lora.rank=4", "optim.lr=1e-2", "seed=1"]))
    engine2 = Engine(cfg, m2)  # in the same process group
    engine2.load(ckpt, "t")
    resumed = engine2.published_state()
    if ranks.leader:
        base = [k for k in state if not lora.is_adapter(k)]
        adapters = [k for k in state if lora.is_adapter(k)]
        result = {
            "published_only_adapters": sorted(published) == sorted(adapters),
            "adapters": len(adapters),
            "base_unchanged": all(torch.equal(state[k], before[k]) for k in base),
            "lora_B_moved": all(state[k].abs().max().item() > 0 for k in adapters if ".lora_B." in k),
            "lora_A_moved": any(not torch.equal(state[k], before[k]) for k in adapters if ".lora_A." in k),
            "adapter_dtypes": sorted({str(state[k].dtype) for k in adapters}),
            "base_dtypes": sorted({str(state[k].dtype) for k in base if k.endswith("proj.base_layer.weight")}),
            "resumed_equal": sorted(resumed) == sorted(published)
            and all(torch.equal(resumed[k], published[k]) for k in published),
            "trainable": sum(p.numel() for p in m.parameters() if p.requires_grad),
        }
        with open(os.path.join(out_dir, "result.json"), "w") as f:
            json.dump(result, f)
    engine2.close()


CASES = [(0, 1, "float32"), (0, 1, "bfloat16"), (1, 2, "float32"), (2, 2, "float32"), (3, 2, "float32"),
         (3, 2, "bfloat16")]


@pytest.mark.long
@pytest.mark.parametrize("zero,world,dtype", CASES)
def test_lora_trains_only_the_adapters_and_resumes_them_at_every_zero_stage(tmp_path, zero, world, dtype):
    port = free_ports(1)[0]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, world, port, zero, dtype, str(tmp_path))) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        if p.exitcode is None:
            p.kill()
    assert [p.exitcode for p in procs] == [0] * world
    r = json.loads((tmp_path / "result.json").read_text())
    print(zero, world, dtype, r)
    assert r["published_only_adapters"] and r["adapters"] == 2 * 7 * 2  # A and B of 7 projections in 2 layers
    assert r["base_unchanged"], "a frozen base weight changed"
    assert r["lora_B_moved"] and r["lora_A_moved"]
    assert r["adapter_dtypes"] == ["torch.float32"]
    assert r["base_dtypes"] == [f"torch.{dtype}"]
    assert r["resumed_equal"]
