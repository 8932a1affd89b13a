"""learner.minibatches = k: k optimizer steps on one batch against proximal log-probs taken once, before the first
step (decoupled PPO's `*-4step`); k = 1 is the single step it always was."""

from __future__ import annotations

import json
import multiprocessing as mp

import pytest
from fakes.stale_groups import stale_groups as _groups


def _run(out_path: str) -> None:
    """In a process of its own (the engine initialises torch.distributed): every finding as JSON."""
    import torch

    torch.set_num_threads(1)
    from streamrl import config, tasks
    from streamrl.algo import advantages
    from streamrl.learner import minibatches, step
    from streamrl.learner.batch import collate
    from streamrl.learner.engine import Engine
    from streamrl.models import model

    def engine(k: int) -> tuple[Engine, int]:
        cfg = config.load(None, ["learner.batch_groups=4", "loss.name=decoupled_ppo", f"learner.minibatches={k}",
                                 "seed=3"])
        torch.manual_seed(cfg.seed)
        m, tok = model.build(cfg, tasks.build(cfg.task).vocabulary)
        return Engine(cfg, m), tok.pad_token_id

    found: dict = {}
    e4, pad = engine(2)
    groups = _groups(4, 0)
    batch = collate(groups, pad)
    adv = advantages.compute(batch.rewards, "grpo", 0.0, False)
    before = {0: minibatches.proximal_logprobs(e4, batch.groups(0, 2)),
              1: minibatches.proximal_logprobs(e4, batch.groups(2, 4))}
    seen: list[dict] = []
    micro = e4._micro_step

    def spy(b, rows, length, a, n_tokens, n_seqs, chunks=None, idle=False, proximal=None):
        out = micro(b, rows, length, a, n_tokens, n_seqs, chunks, idle, proximal)
        moving = minibatches.proximal_logprobs(e4, b)  # after the backward, before this minibatch's step
        seen.append({"proximal": proximal.clone(), "moving": moving, "clipped": int(out.clipped.sum())})
        return out

    e4._micro_step = spy
    rec = step.train(e4, groups, e4.cfg, pad)
    found["optimizer_steps"] = rec.optimizer_steps
    found["proximal_is_pre_update"] = [torch.equal(s["proximal"], before[i]) for i, s in enumerate(seen)]
    found["moving_equals_proximal"] = [torch.equal(s["moving"], s["proximal"]) for s in seen]
    found["clipped"] = [s["clipped"] for s in seen]
    found["lag"] = rec.lag_max

    # k = 1 through the minibatch path (proximal computed and passed) against today's single step: the same
    # weights bit for bit after two batches
    a, _ = engine(1)
    b, _ = engine(1)
    for s in range(2):
        bt = collate(_groups(4, s + 1), pad)
        ad = advantages.compute(bt.rewards, "grpo", 0.0, False)
        a.train_step(bt, ad)
        minibatches.train(b, bt, ad)
    sa, sb = a.full_state_dict(), b.full_state_dict()
    found["k1_bit_for_bit"] = all(torch.equal(sa[k], sb[k]) for k in sa)
    found["k1_optimizer_steps"] = [a.optimizer_steps, b.optimizer_steps]
    a.close()  # the process group: once for all three engines
    with open(out_path, "w") as f:
        json.dump(found, f)


@pytest.fixture(scope="module")
def found(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("minibatches") / "found.json"
    p = mp.get_context("spawn").Process(target=_run, args=(str(out),))
    p.start()
    p.join(300)
    assert p.exitcode == 0
    return json.loads(out.read_text())


def test_every_minibatch_is_clipped_against_the_log_probs_from_before_the_first_step(found):
    assert found["optimizer_steps"] == 2
    assert found["proximal_is_pre_update"] == [True, True]
    # the first minibatch trains on the weights the proximal log-probs came from; the second on weights the
    # first step moved, which the proximal log-probs do not follow
    assert found["moving_equals_proximal"] == [True, False]
    assert found["clipped"][0] == 0


def test_one_minibatch_through_the_proximal_path_reproduces_the_single_step_bit_for_bit(found):
    assert found["k1_bit_for_bit"]
    assert found["k1_optimizer_steps"] == [2, 2]


def test_strict_mode_refuses_several_optimizer_steps_per_batch():
    from streamrl import config

    with pytest.raises(ValueError, match="learner.minibatches=2: on_policy strict needs 1"):
        config.load(None, ["on_policy=strict", "learner.minibatches=2"])
    assert config.load(None, ["on_policy=strict"]).learner.minibatches == 1
