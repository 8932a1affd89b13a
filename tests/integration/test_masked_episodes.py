"""Two-turn episodes (the model's turn, an environment's reply, the model's answer) sampled by the tiny
model, with the environment's tokens marked on the wire: the strict on-policy check covers the model's
tokens alone (a wrong behaviour log-prob under an environment token passes, one under a model token
fires), and a real learner on loopback trains on such groups from a test-only actor, strictly on-policy,
counting only the model's tokens."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import zmq
from procs import REPO, free_ports, metrics, reaped, spawn, summary

from streamrl import config, tasks
from streamrl.comm import codec
from streamrl.models import sampling

pytestmark = pytest.mark.slow
TINY = str(REPO / "configs" / "tiny.yaml")
GARBAGE = -30.0  # a behaviour "log-prob" under an environment token: ignored, or the strict check would fire


def two_turn_groups(model, tok, task, rng: random.Random, n_groups: int, G: int, version: int,
                    ) -> list[codec.ScoredGroup]:
    """n_groups prompts × G episodes: turn 1 (≤ 3 tokens), the environment's 2 tokens (the prompt's first
    two, as a tool would echo), turn 2 sampled after them (≤ 3 tokens). The completion is all three, the
    mask marks the middle as the environment's, and the log-probs there are GARBAGE."""
    prompts = [tok(task.sample(rng).text)["input_ids"] for _ in range(n_groups)]
    kw = dict(temperature=1.0, max_new_tokens=3, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id)
    first = sampling.generate(model, prompts, G, **kw)
    env = [p[:2] for p in prompts]
    second = sampling.generate(model, [p + c.tokens + e for p, cs, e in zip(prompts, first, env) for c in cs], 1, **kw)
    groups = []
    for k, (p, cs, e) in enumerate(zip(prompts, first, env)):
        answers = [s[0] for s in second[k * G:(k + 1) * G]]
        g = codec.ScoredGroup.make(
            prompt_id=f"v{version}-{k}", policy_version=version, actor_id="actor-0", prompt_tokens=p,
            completions=[c.tokens + e + a.tokens for c, a in zip(cs, answers)],
            logprobs=[c.logprobs + [0.0] * len(e) + a.logprobs for c, a in zip(cs, answers)],
            rewards=[rng.random() for _ in cs], finish_reasons=[a.finish_reason for a in answers],
            model_token_masks=[np.array([True] * len(c.tokens) + [False] * len(e) + [True] * len(a.tokens))
                               for c, a in zip(cs, answers)])
        g.behaviour_logprobs[~g.model_token_mask] = GARBAGE  # valid on the wire; the learner must not read it
        groups.append(g)
    return groups


def model_tokens(groups: list[codec.ScoredGroup]) -> int:
    return sum(int(g.model_token_mask.sum()) for g in groups)


def _strict_cases(out_path: str) -> None:
    """Two strict steps of a real learner engine on two-turn episodes; writes which case fired. In a process
    of its own: the engine initialises torch.distributed, whose port a learner started later would inherit."""
    import copy
    import json

    from streamrl.learner import step, stepstats
    from streamrl.learner.engine import Engine
    from streamrl.models import model as model_lib

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = config.load(TINY, ["learner.batch_groups=4", "on_policy=strict", "advantage.estimator=grpo",
                             "advantage.r_min_correct=0.75"])
    task = tasks.build(cfg.task)
    m, tok = model_lib.build(cfg, task.vocabulary)
    actor = copy.deepcopy(m).eval()
    engine = Engine(cfg, m)
    rng = random.Random(0)
    tol = stepstats.ratio_tolerance(None, cfg.model.dtype)
    results = {}
    for version, case in enumerate(["garbage_under_environment_tokens", "one_model_token_off"]):
        actor.load_state_dict({k: v.clone() for k, v in engine.full_state_dict().items()})
        groups = two_turn_groups(actor, tok, task, rng, 4, 8, version)
        if case == "one_model_token_off":
            g = groups[2]
            i = int(np.flatnonzero(g.model_token_mask)[-1])
            g.behaviour_logprobs[i] -= 1.0  # a model token whose behaviour log-prob is not the sampler's
        rec = step.train(engine, groups, cfg, tok.pad_token_id, step=version, version=version)
        try:
            stepstats.check_strict(rec, tol)
            fired = None
        except stepstats.StrictModeViolation as e:
            fired = str(e)
        results[case] = {"fired": fired, "tokens": rec.tokens, "model_tokens": model_tokens(groups),
                         "kl_max": rec.group_kl_behaviour_learner_max}
    engine.close()
    with open(out_path, "w") as f:
        json.dump({"tolerance": tol, **results}, f)


def test_the_strict_check_covers_model_tokens_only(tmp_path):
    import json
    import multiprocessing as mp

    proc = mp.get_context("spawn").Process(target=_strict_cases, args=(str(tmp_path / "cases.json"),))
    proc.start()
    proc.join(300)
    if proc.exitcode is None:
        proc.kill()
    assert proc.exitcode == 0
    r = json.loads((tmp_path / "cases.json").read_text())
    print(json.dumps(r, indent=1))  # the measured statistics, for the record
    garbage, off = r["garbage_under_environment_tokens"], r["one_model_token_off"]
    assert garbage["fired"] is None and garbage["tokens"] == garbage["model_tokens"]
    assert off["fired"] and "a group's KL(behaviour ‖ learner) estimated at" in off["fired"]


def test_a_learner_on_loopback_trains_strictly_on_masked_episodes_from_a_test_actor(tmp_path):
    from streamrl.actors import backends
    from streamrl.comm.control import Inbox
    from streamrl.comm.groups import GroupSender
    from streamrl.comm.sockets import endpoint
    from streamrl.comm.weights.subscriber import WeightSubscriber
    from streamrl.models import model as model_lib
    from streamrl.run import fingerprint

    g, w, r = free_ports(3)
    steps, groups_per_step = 3, 4
    overrides = [f"run_dir={tmp_path}", "name=masked", f"steps={steps}", "on_policy=strict", "actors.num=1",
                 f"learner.batch_groups={groups_per_step}", "actors.group_size=4", f"transport.group_port={g}",
                 f"transport.weights_port={w}", f"transport.weights_request_port={r}"]
    learner = spawn(["learner", TINY, *overrides], tmp_path / "learner.log")
    with reaped(learner):
        cfg = config.load(TINY, overrides)
        task = tasks.build(cfg.task)
        torch.manual_seed(1)
        m, tok = model_lib.build(cfg, task.vocabulary)
        backend = backends.build("hf", cfg, m, tok, 0)
        ctx = zmq.Context()
        inbox = Inbox(ctx, endpoint("127.0.0.1", r), "actor-0", cfg.transport.max_message_bytes,
                      fingerprint=fingerprint.of(cfg))
        sub = WeightSubscriber(ctx, endpoint("127.0.0.1", w), inbox, cfg.transport.max_message_bytes)
        sender = GroupSender(ctx, endpoint("127.0.0.1", g), cfg.transport.send_hwm, "actor-0")
        rng, sent = random.Random(0), []

        def weights(version: int):
            """The learner's weights of `version`. A demand for more groups at the version before (the learner
            waited while this actor generated, slowly on a loaded machine) is answered already: keep waiting."""
            while True:
                got = sub.wait_for(version, timeout_s=240, ask_first=version == 0,
                                   stop=lambda: learner.poll() is not None)
                if got is not None or inbox.take_demand(version - 1) is None:
                    return got

        try:
            for version in range(steps):
                got = weights(version)
                assert got is not None and got[0] == version, (tmp_path / "learner.log").read_text()[-3000:]
                backend.load_weights(got[1])
                groups = two_turn_groups(m, tok, task, rng, groups_per_step, cfg.actors.group_size, version)
                assert sender.send_batch(groups, timeout_s=60)
                sent.append(model_tokens(groups))
            sender.report(steps * groups_per_step, "done")
            assert learner.wait(timeout=120) == 0, (tmp_path / "learner.log").read_text()[-3000:]
        finally:
            sender.close(linger_s=1.0)
            sub.close()
            inbox.close()
            ctx.term()
    recs = metrics(tmp_path / "masked")
    assert [rec["learner_version"] for rec in recs] == [1, 2, 3]
    assert [rec["tokens"] for rec in recs] == sent  # the model's tokens alone, never the environment's
    assert all(rec["group_kl_behaviour_learner_max"] < 1e-6 for rec in recs)  # GARBAGE read would make it > 1
    done = summary(tmp_path / "masked")
    assert done["messages_rejected"] == {} and done["groups_used"] == steps * groups_per_step
