"""A batch that carries no learning signal (every advantage 0, so the gradient is exactly 0) takes no optimizer step:
the weights and Adam's moments stay as they were, the lr schedule still ticks, and the step's record says so. On
the old code Adam stepped on the zero gradient, moving the weights along its momentum and decaying its second moment:
the cause of the default job's collapse after ~4,000 steps at reward 1.00 (docs/reference/benchmarks.md)."""

from __future__ import annotations

import json
import multiprocessing as mp

import pytest


def _steps(out_path: str) -> None:
    """A real engine's step on a batch with a signal, then one on a batch whose every reward is 1 (CoRPO: every
    advantage 0); writes what changed. In a process of its own: the engine initialises torch.distributed."""
    import torch

    torch.set_num_threads(1)
    from streamrl import config, tasks
    from streamrl.comm.codec import ScoredGroup
    from streamrl.learner import step
    from streamrl.learner.engine import Engine
    from streamrl.models import model

    cfg = config.load(None, ["learner.batch_groups=2", "optim.warmup_steps=4"])
    m, tok = model.build(cfg, tasks.build(cfg.task).vocabulary)
    engine = Engine(cfg, m)

    def groups(rewards):
        return [ScoredGroup.from_samples(
            prompt_id=f"p{i}", policy_version=0, actor_id="a", prompt_tokens=[5, 6, 7], completions=[[8, 9]] * 4,
            logprobs=[[-1.0, -1.0]] * 4, rewards=rewards, finish_reasons=["stop"] * 4) for i in range(2)]

    def state():
        opt = engine.optimizer
        return ([p.detach().clone() for p in engine.engine.module.parameters()],
                [{k: (v.clone() if torch.is_tensor(v) else v) for k, v in opt.state[p].items()}
                 for p in engine.engine.module.parameters()])

    signal = step.train(engine, groups([1.0, 0.25, 0.5, 1.0]), cfg, tok.pad_token_id)
    weights, moments = state()
    quiet = step.train(engine, groups([1.0] * 4), cfg, tok.pad_token_id, step=1, version=1)
    weights2, moments2 = state()
    again = step.train(engine, groups([1.0, 0.25, 0.5, 1.0]), cfg, tok.pad_token_id, step=2, version=2)
    weights3, _ = state()
    engine.close()
    same = lambda a, b: torch.equal(a, b) if torch.is_tensor(a) else a == b  # noqa: E731
    with open(out_path, "w") as f:
        json.dump({"records": [signal.record(), quiet.record(), again.record()],
                   "weights_kept": all(torch.equal(a, b) for a, b in zip(weights, weights2)),
                   "moments_kept": all(same(s[k], t[k]) for s, t in zip(moments, moments2) for k in s),
                   "moments_filled": all(float(s["exp_avg_sq"].abs().sum()) > 0 for s in moments if s),
                   "weights_moved_after": not all(torch.equal(a, b) for a, b in zip(weights2, weights3)),
                   "grads_cleared": all(p.grad is None or not p.grad.any() for p in engine.engine.module.parameters())},
                  f, default=str)


@pytest.fixture(scope="module")
def found(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("zero") / "found.json"
    p = mp.get_context("spawn").Process(target=_steps, args=(str(out),))
    p.start()
    p.join(300)
    assert p.exitcode == 0
    return json.loads(out.read_text())


def test_a_batch_with_every_advantage_zero_leaves_the_weights_and_adams_moments_untouched(found):
    assert found["moments_filled"]  # the first batch's step gave Adam moments a zero gradient would decay
    assert found["weights_kept"] and found["moments_kept"] and found["grads_cleared"]
    assert found["weights_moved_after"]  # the next batch with a signal steps again


def test_the_skipped_step_is_reported_in_its_metrics_record_and_the_lr_schedule_still_counts_it(found):
    signal, quiet, again = found["records"]
    assert quiet["adv_zero"] == 8 and quiet["grad_norm"] == 0.0
    assert (quiet["optimizer_steps"], quiet["optimizer_skipped"]) == (0, 1)
    assert (signal["optimizer_steps"], signal["optimizer_skipped"]) == (1, 0)
    assert (again["optimizer_steps"], again["optimizer_skipped"]) == (1, 0)
    # warm-up over 4 batches: lr after batch k is (k + 2) / 4 of the peak, the skipped batch counted
    peak = 3e-4
    assert [r["lr"] for r in found["records"]] == pytest.approx([peak * 2 / 4, peak * 3 / 4, peak * 4 / 4])
