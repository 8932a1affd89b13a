"""The learner's step on CUDA: DeepSpeed trains on the GPU while the batch, the step's record and the
strict check stay on the host. The first GPU run failed at its first step: the record mixed the step's
per-token outputs (on cuda) with the batch's masks (on the CPU). Here an actor copy on the same GPU
samples, the engine steps, and the record is made and checked strictly, in float32 and bfloat16.
Skips without CUDA."""

from __future__ import annotations

import json
import multiprocessing as mp

import pytest
import torch

pytestmark = pytest.mark.gpu


def _step(dtype: str, out_path: str) -> None:
    import copy
    import random

    from streamrl import config, tasks
    from streamrl.comm.codec import ScoredGroup
    from streamrl.learner import step, stepstats
    from streamrl.learner.engine import Engine
    from streamrl.models import model, sampling

    cfg = config.load(None, [f"model.dtype={dtype}", "learner.batch_groups=8", "advantage.estimator=corpo",
                             "advantage.r_min_correct=0.75"])
    task = tasks.build(cfg.task)
    m, tok = model.build(cfg, task.vocabulary)
    actor = copy.deepcopy(m).eval().cuda()
    engine = Engine(cfg, m)
    rng = random.Random(0)
    prompts = [tok(task.sample(rng).text)["input_ids"] for _ in range(8)]
    done = sampling.generate(actor, prompts, 4, temperature=1.0, max_new_tokens=6, pad_id=tok.pad_token_id,
                             eos_id=tok.eos_token_id, device="cuda")
    groups = [ScoredGroup.from_samples(
        prompt_id=f"p{i}", policy_version=0, actor_id="a", prompt_tokens=p, completions=[c.tokens for c in cs],
        logprobs=[c.logprobs for c in cs], rewards=[rng.random() for _ in cs], finish_reasons=[c.finish_reason for c in cs])
        for i, (p, cs) in enumerate(zip(prompts, done))]
    rec = step.train(engine, groups, cfg, tok.pad_token_id)
    try:
        stepstats.check_strict(rec, stepstats.ratio_tolerance(None, dtype))
        fired = None
    except stepstats.StrictModeViolation as e:
        fired = str(e)
    with open(out_path, "w") as f:
        devices = sorted({str(t.device) for t in rec.tensors.values() if isinstance(t, torch.Tensor)})
        json.dump({"device": str(engine.device), "tensor_devices": devices,
                   "fired": fired, **{k: getattr(rec, k) for k in ("loss", "is_ratio_max_abs_dev",
                                                                   "group_kl_behaviour_learner_max")}}, f)
    engine.close()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_learner_step_on_cuda_is_recorded_on_the_host_and_passes_the_strict_check(tmp_path, dtype):
    if torch.cuda.device_count() == 0:  # NVML: CUDA stays uninitialised in the pytest process
        pytest.skip("needs a GPU")
    path = tmp_path / "step.json"
    p = mp.get_context("spawn").Process(target=_step, args=(dtype, str(path)))
    p.start()
    p.join(300)
    assert p.exitcode == 0
    r = json.loads(path.read_text())
    print(dtype, r)
    assert r["device"].startswith("cuda") and r["tensor_devices"] == ["cpu"]
    assert r["fired"] is None, r["fired"]
