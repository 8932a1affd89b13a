"""`streamrl bench proximal`: decoupled PPO's step with A-3PO's interpolated proximal log-probs
(loss.proximal=interpolate) against the same step with the proximal forward pass (forward).

Two learner engines with the same initial weights (the release-shaped model of `streamrl bench learner`:
151,936 vocabulary, fp32 on CPU), each taking learner.minibatches optimizer steps per batch on the same stale
batch (generated 4 versions back), interleaved round by round in one process. Reported: each path's median
`train_step` time and their ratio (forward / interpolate: above 1 is time saved).
"""

from __future__ import annotations

import copy
import statistics
import time

import torch


def proximal(short: bool = False) -> list[dict]:
    """The interpolated proximal against the forward-pass proximal, interleaved (see the module docstring), in a
    process of its own: after another bench's engine closed its process group in this one, DeepSpeed's cached groups
    refer to the destroyed group and a new engine's start fails ("Group ... is not registered")."""
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(_proximal, (short,))


def _proximal(short: bool) -> list[dict]:
    from streamrl import config
    from streamrl.bench.learner import _batch, _model
    from streamrl.learner.engine import Engine

    groups, group_size, k, rounds = (2, 4, 2, 2) if short else (4, 8, 4, 5)
    prompt, completion = ((8, 16), (4, 12)) if short else ((16, 32), (8, 48))
    base = [f"learner.batch_groups={groups}", f"actors.group_size={group_size}", f"learner.minibatches={k}",
            "loss.name=decoupled_ppo", "learner.micro_batch_tokens=256"]
    model = _model()
    batch = _batch(groups, group_size, prompt, completion, model.config.vocab_size)
    adv = torch.randn(groups, group_size, generator=torch.Generator().manual_seed(1))
    engines = {p: Engine(config.load(None, [*base, f"loss.proximal={p}"]), copy.deepcopy(model))
               for p in ("forward", "interpolate")}
    torch.set_num_threads(engines["forward"].cfg.learner.threads or torch.get_num_threads())
    times: dict[str, list[float]] = {p: [] for p in engines}
    try:
        for r in range(rounds + 1):  # round 0 warms up both paths (allocator, DeepSpeed's first step)
            for p, engine in engines.items():
                t0 = time.perf_counter()
                engine.train_step(batch, adv, version=4)
                if r:
                    times[p].append(time.perf_counter() - t0)
    finally:
        engines["forward"].close()  # the process group: once for both engines
    med = {p: statistics.median(v) for p, v in times.items()}
    return [{"bench": "proximal", "vocab": model.config.vocab_size, "rows": batch.input_ids.shape[0],
             "completion_tokens": batch.num_tokens, "minibatches": k, "rounds": rounds,
             "forward_step_s": med["forward"], "interpolate_step_s": med["interpolate"],
             "ratio_forward_over_interpolate": med["forward"] / med["interpolate"],
             "ratio_min": min(f / i for f, i in zip(times["forward"], times["interpolate"]))}]
