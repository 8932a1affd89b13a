"""The strict self-check against real generation: quiet on an on-policy batch in float32 and
bfloat16, and firing when one group of the 16 was sampled one version back or at the wrong temperature."""

from __future__ import annotations

import json
import multiprocessing as mp
import os

import pytest
import torch

pytestmark = pytest.mark.slow


def _cases(dtype: str, out_path: str) -> None:
    """Four steps of a learner and an actor model (a copy, as the actors hold), each checked strictly."""
    import copy
    import random

    torch.set_num_threads(1)
    import msgspec

    from streamrl import config, tasks
    from streamrl.comm.codec import ScoredGroup
    from streamrl.learner import step, stepstats
    from streamrl.learner.engine import Engine
    from streamrl.models import model, sampling

    # STREAMRL_STRICT_CHECK_OVERRIDES: more overrides, to check by hand another objective (loss.name=m2po) or the
    # engine's strict path (on_policy=strict), which must both leave the check's verdicts unchanged
    more = os.environ.get("STREAMRL_STRICT_CHECK_OVERRIDES", "").split()
    cfg = config.load(None, [f"model.dtype={dtype}", "learner.batch_groups=16", "advantage.estimator=grpo", *more])
    task = tasks.build(cfg.task)
    m, tok = model.build(cfg, task.vocabulary)
    actor = copy.deepcopy(m).eval()
    engine = Engine(cfg, m)
    rng = random.Random(0)
    tol = stepstats.ratio_tolerance(None, dtype)

    def groups(weights, n: int, version: int, temperature: float = 1.0) -> list[ScoredGroup]:
        prompts = [tok(task.sample(rng).text)["input_ids"] for _ in range(n)]
        done = sampling.generate(weights, prompts, 8, temperature=temperature, max_new_tokens=4,
                                 pad_id=tok.pad_token_id, eos_id=tok.eos_token_id)
        return [ScoredGroup.from_samples(
            prompt_id=f"p{i}", policy_version=version, actor_id="a", prompt_tokens=p, completions=[c.tokens for c in cs],
            logprobs=[c.logprobs for c in cs], rewards=[rng.random() for _ in cs], finish_reasons=[c.finish_reason for c in cs])
            for i, (p, cs) in enumerate(zip(prompts, done))]

    results = {}
    for version, case in enumerate(["on_policy", "one_version_back", "temperature_0.8", "on_policy_later"]):
        previous = copy.deepcopy(actor)
        actor.load_state_dict({k: v.clone() for k, v in engine.full_state_dict().items()})  # the newest weights
        made = groups(actor, 16 if case.startswith("on_policy") else 15, version)  # the default batch
        if case == "one_version_back":  # stamped with the current version, sampled by the previous weights
            made.append(groups(previous, 1, version)[0])
        if case == "temperature_0.8":
            made.append(groups(actor, 1, version, temperature=0.8)[0])
        rec = step.train(engine, made, cfg, tok.pad_token_id, step=version, version=version)
        try:
            stepstats.check_strict(rec, tol)
            fired = None
        except stepstats.StrictModeViolation as e:
            fired = str(e)
        stats = ("group_kl_behaviour_learner_max", "kl_behaviour_learner", "log_ratio_abs_mean",
                 "sample_log_ratio_abs_max", "is_ratio_max_abs_dev")
        results[case] = {"fired": fired, **{k: getattr(rec, k) for k in stats}}
    lagged = msgspec.structs.replace(rec, lag_max=1)  # a group stamped one version back
    try:
        stepstats.check_strict(lagged, tol)
    except stepstats.StrictModeViolation as e:
        results["stamped_one_version_back"] = {"fired": str(e)}
    engine.close()
    with open(out_path, "w") as f:
        json.dump({"tolerance": tol, **results}, f)


DTYPES = ("float32", "bfloat16")


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict:
    """Both dtypes' cases, run at once: each process trains on one thread, so on two cores they take the time
    of one. Maps dtype -> (exit code, the cases' JSON path)."""
    tmp = tmp_path_factory.mktemp("strict-check")
    procs = {d: mp.get_context("spawn").Process(target=_cases, args=(d, str(tmp / f"{d}.json"))) for d in DTYPES}
    for p in procs.values():
        p.start()
    for p in procs.values():
        p.join(300)
        if p.exitcode is None:
            p.kill()
    return {d: (p.exitcode, tmp / f"{d}.json") for d, p in procs.items()}


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_strict_check_fires_on_a_stale_or_mistempered_group_and_not_on_an_on_policy_batch(cases, dtype):
    exitcode, out = cases[dtype]
    assert exitcode == 0
    r = json.loads(out.read_text())
    print(dtype, json.dumps(r, indent=1))  # the measured statistics, for the record
    assert r["on_policy"]["fired"] is None and r["on_policy_later"]["fired"] is None
    for case in ("one_version_back", "temperature_0.8"):
        assert r[case]["fired"] and "a group's KL(behaviour ‖ learner) estimated at" in r[case]["fired"], case
    assert "lag 1" in r["stamped_one_version_back"]["fired"]
