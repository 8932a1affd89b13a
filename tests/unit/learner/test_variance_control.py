"""loss.variance_control, optim.target_drift and loss.proximal on the real engine: the ESS and drift scales land on
the step's learning rate (the update shrinks by exactly them), strict mode is untouched bit for bit, the minimum-variance baseline takes the weights
the training forward then applies, and A-3PO's proximal takes no forward pass."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pytest
from fakes.stale_groups import stale_groups as _groups


def _run(out_path: str) -> None:
    """In a process of its own (the engine initialises torch.distributed): every finding as JSON."""
    import torch

    torch.set_num_threads(1)
    from streamrl import config, tasks
    from streamrl.algo import advantages, losses, variance
    from streamrl.learner import minibatches, step
    from streamrl.learner.batch import collate
    from streamrl.learner.engine import Engine
    from streamrl.models import model

    built = []

    def engine(*overrides: str) -> Engine:
        cfg = config.load(None, ["learner.batch_groups=4", "seed=3", *overrides])
        torch.manual_seed(cfg.seed)
        m, tok = model.build(cfg, tasks.build(cfg.task).vocabulary)
        built.append(Engine(cfg, m))
        return built[-1]

    def delta(e: Engine, before: dict) -> torch.Tensor:
        return torch.cat([(v - before[k]).flatten() for k, v in e.full_state_dict().items()])

    found: dict = {}
    groups = _groups(4, 0)
    pad = 0

    # ESS step: the same batch, the same start; the scaled engine's update is the unscaled one's times its scale
    off = "optim.target_drift=null"  # the ESS scale alone
    scaled, plain = engine("loss.name=tis", "loss.variance_control=ess_step", off), engine("loss.name=tis", off)
    start = {k: v.clone() for k, v in plain.full_state_dict().items()}
    a, b = step.train(scaled, groups, scaled.cfg, pad, version=8), step.train(plain, groups, plain.cfg, pad, version=8)
    found["ess"] = [a.is_ess_fraction, b.is_ess_fraction]
    found["scale"] = [a.step_scale, b.step_scale]
    da, db = delta(scaled, start), delta(plain, start)
    found["update_ratio_err"] = float((da - a.step_scale * db).abs().max() / db.abs().max())

    # drift: a lag-8 batch measures its token-mean KL / 8 per version; the update shrinks by the scale that gives
    drifted, twin = engine("loss.name=tis", "optim.target_drift=1e-3"), engine("loss.name=tis", off)
    start = {k: v.clone() for k, v in twin.full_state_dict().items()}
    c, d = step.train(drifted, groups, drifted.cfg, pad, version=8), step.train(twin, groups, twin.cfg, pad, version=8)
    found["drift"] = [c.drift_per_version, c.kl_behaviour_learner, c.step_scale, d.drift_per_version, d.step_scale]
    dc, dd = delta(drifted, start), delta(twin, start)
    found["drift_update_ratio_err"] = float((dc - c.step_scale * dd).abs().max() / dd.abs().max())
    found["drift_second"] = step.train(drifted, groups, drifted.cfg, pad, version=9).step_scale
    drifted.save(str(Path(out_path).parent / "ckpt"), "step-2")  # the scale goes on with a resumed run
    resumed = engine("loss.name=tis", "optim.target_drift=1e-3")
    resumed.load(str(Path(out_path).parent / "ckpt"), "step-2")
    found["drift_resumed"] = resumed.drift_scale

    # strict: every control on, the objective sees behaviour = current, so nothing changes bit for bit
    strict_vc = engine("on_policy=strict", "loss.variance_control=both", "optim.target_drift=1e-3")
    strict = engine("on_policy=strict", off)
    s1, s2 = step.train(strict_vc, groups, strict_vc.cfg, pad), step.train(strict, groups, strict.cfg, pad)
    found["strict"] = [s1.step_scale, s1.is_ess_fraction, s2.step_scale]
    found["strict_drift"] = s1.drift_per_version
    sa, sb = strict_vc.full_state_dict(), strict.full_state_dict()
    found["strict_bit_for_bit"] = all(torch.equal(sa[k], sb[k]) for k in sa)

    # mvb: the advantages the step trains on are shifted by the baseline of the weights the training forward of a
    # twin engine (no mvb) applies
    mvb, twin = engine("loss.name=tis", "loss.variance_control=mvb", off), engine("loss.name=tis", off)
    batch = collate(groups, pad)
    adv = advantages.compute(batch.rewards, "corpo", 0.5)
    seen = []
    inner = mvb.optimizer_step
    mvb.optimizer_step = lambda bt, ad, *r, **kw: (seen.append(ad.clone()), inner(bt, ad, *r, **kw))[1]
    mvb.train_step(batch, adv)
    out, _ = twin.train_step(batch, adv)
    want = adv - variance.baseline_shift(out.weights, losses.token_weights(batch.completion_mask), adv)[:, None]
    found["mvb_err"] = float((seen[0] - want).abs().max())
    found["mvb_moved"] = float((seen[0] - adv).abs().max())

    # A-3PO: two minibatches, no proximal forward pass; α = 1 on the first, lag·k / (lag·k + 1) = 6/7 on the second
    a3 = engine("loss.name=decoupled_ppo", "learner.minibatches=2", "loss.proximal=interpolate")
    passed = []
    micro = a3._micro_step

    def spy(*args, proximal=None, **kw):
        passed.append(proximal.tolist())
        return micro(*args, proximal=proximal, **kw)

    a3._micro_step = spy
    minibatches.proximal_logprobs = None  # a forward pass would fail here
    rec = step.train(a3, groups, a3.cfg, pad, version=3)
    found["a3_steps"] = rec.optimizer_steps
    found["a3_alpha"] = [sorted(set(p)) for p in passed]
    built[0].close()  # the process group: once for every engine
    with open(out_path, "w") as f:
        json.dump(found, f)


@pytest.fixture(scope="module")
def found(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("variance") / "found.json"
    p = mp.get_context("spawn").Process(target=_run, args=(str(out),))
    p.start()
    p.join(600)
    assert p.exitcode == 0
    return json.loads(out.read_text())


def test_the_ess_scale_shrinks_the_update_by_exactly_itself(found):
    ess, _ = found["ess"]
    assert 0 < ess < 0.99  # the stale batch's weights are unequal
    assert found["scale"] == [pytest.approx(ess ** 0.5, abs=1e-12), 1.0]
    # up to float32 rounding of each weight's update (~1e-7 on weights near 1); without the scale it would be 1 - scale
    assert found["update_ratio_err"] < 5e-3 < 1 - found["scale"][0]


def test_the_drift_scale_follows_the_measured_drift_per_version_and_shrinks_the_update_by_itself(found):
    drift, kl, scale, plain_drift, plain_scale = found["drift"]
    assert drift == pytest.approx(kl / 8, rel=1e-9)  # every group 8 versions old
    assert drift > 4e-3  # 4 x the target: the scale falls by the most one step may move it
    assert scale == 0.5 and [plain_drift, plain_scale] == [None, 1.0]
    assert found["drift_update_ratio_err"] < 5e-3  # up to float32 rounding of each weight's update
    assert found["drift_second"] == 0.25  # carried from step to step, still too far
    assert found["drift_resumed"] == 0.25  # and through a checkpoint


def test_strict_mode_with_every_control_is_the_plain_strict_step_bit_for_bit(found):
    assert found["strict"] == [1.0, 1.0, 1.0]
    assert found["strict_drift"] is None  # lag 0 everywhere: nothing measured, the lr untouched
    assert found["strict_bit_for_bit"]


def test_the_minimum_variance_baseline_takes_the_weights_the_training_forward_applies(found):
    assert found["mvb_moved"] > 1e-3
    assert found["mvb_err"] < 1e-6


def test_a3po_interpolates_the_proximal_policy_without_a_forward_pass(found):
    assert found["a3_steps"] == 2
    assert found["a3_alpha"] == [[1.0], [pytest.approx(6 / 7, abs=1e-12)]]
