"""Multi-layer GRPO: layer-2 queries, verified corrections, augmentation and the five metrics."""

from __future__ import annotations

import random

import pytest
import torch

from streamrl import config, tasks
from streamrl.actors import rollout
from streamrl.actors.backends import Completion
from streamrl.algo import mgrpo
from streamrl.tasks import rewards, symbols

PHRASES = ("Wait, let me double-check that.", "Where might I have gone wrong this time? Let me double-check carefully.")


class Words:
    """A growing word-level tokenizer: every whitespace word gets an id; records what it encoded."""

    def __init__(self):
        self.vocab: dict[str, int] = {}
        self.encoded: list[str] = []

    def __call__(self, text, add_special_tokens=False):
        self.encoded.append(text)
        return {"input_ids": [self.vocab.setdefault(w, len(self.vocab)) for w in text.split()]}

    def decode(self, tokens, skip_special_tokens=True):
        inv = {i: w for w, i in self.vocab.items()}
        return " ".join(inv[t] for t in tokens if t != EOS)


EOS = 999
"""The scripted model's end token: a completion that stops ends with it, as a real backend's does."""


class Scripted:
    """actors.backends.Backend that answers each prompt with the next scripted texts (n per prompt)."""

    def __init__(self, tok: Words, script: list[list[str]]):
        self.tok, self.script, self.calls = tok, list(script), []

    def generate(self, prompts, n):
        self.calls.append((len(prompts), n))
        out = []
        for _ in prompts:
            texts = self.script.pop(0)
            assert len(texts) == n, (texts, n)
            out.append([Completion(self.tok(t)["input_ids"] + [EOS], [-0.5] * (len(t.split()) + 1), "stop")
                        for t in texts])
        return out


def _run(script, group_size=4, augment=3, prompt_text="copy : a b =", target=("a", "b"), filtering=False):
    tok = Words()
    prompt = tasks.Prompt(id="p0", text=prompt_text, target=target)
    opts = rollout.RolloutOptions(group_size=group_size, r_min_correct=1.0, phrases=PHRASES, augment=augment,
                                  filter_zero_variance=filtering)
    backend = Scripted(tok, script)
    groups, stats = rollout.make_groups(backend, tok, rewards.Reward(symbols.Copy(4, len(target))), [prompt], opts,
                                        7, "actor-0", random.Random(0))
    return groups, stats, backend, tok


LAYER1 = ["a b", "a x", "x x", "b a"]          # rewards 1, 0.5, 0, 0
CORRECTIONS = [["a b"], ["a b"], ["x b"], ["a b"]]  # responses 0, 1, 3 corrected right; 2 not


def test_layer2_queries_are_the_prompts_and_responses_own_tokens_and_a_phrase_from_the_pool():
    groups, _, _, tok = _run([LAYER1, *CORRECTIONS, ["a b", "a a", "b b"], ["a b"] * 3, ["x x"] * 3])
    phrases = [t for t in tok.encoded if t.startswith(mgrpo.PHRASE_SEPARATOR)]
    assert len(phrases) == 4 and all(p.removeprefix(mgrpo.PHRASE_SEPARATOR) in PHRASES for p in phrases)
    layer2 = [g for g in groups if g.layer == 2]
    prompt = tok("copy : a b =")["input_ids"]
    expected = [prompt + tok(LAYER1[i])["input_ids"] + tok(phrases[i])["input_ids"] for i in (0, 1, 3)]
    assert [g.prompt_tokens.tolist() for g in layer2] == expected   # the end token (EOS) dropped: the turn goes on


def test_only_verified_corrections_are_kept_and_each_is_augmented_h_times():
    groups, stats, backend, _ = _run([LAYER1, *CORRECTIONS, ["a b", "a a", "b b"], ["a b"] * 3, ["x x"] * 3])
    layer1 = [g for g in groups if g.layer == 1]
    layer2 = [g for g in groups if g.layer == 2]
    assert backend.calls == [(1, 4), (4, 1), (3, 3)]    # G responses, one correction each, H for the 3 kept
    assert (stats.corrections, stats.corrections_kept) == (4, 3)
    assert len(layer1) == 1 and layer1[0].corrections == [1.0, 1.0, 0.5, 1.0]
    assert [g.prompt_id for g in layer2] == ["p0/t2/0", "p0/t2/1", "p0/t2/3"]
    for g in layer2:
        assert g.group_size == 4 and g.rewards[0] == 1.0 and g.policy_version == 7   # the kept correction leads
    assert layer2[0].rewards == [1.0, 1.0, 0.5, 0.5] and layer2[2].rewards == [1.0, 0.0, 0.0, 0.0]


def test_no_layer2_group_when_no_correction_verifies():
    groups, stats, backend, _ = _run([LAYER1, ["x x"], ["x x"], ["b b"], ["a x"]])
    assert [g.layer for g in groups] == [1] and stats.corrections_kept == 0 and backend.calls == [(1, 4), (4, 1)]


def test_the_layer2_groups_of_a_filtered_layer1_group_are_not_sent_and_are_counted():
    """A layer-2 group trains in its layer-1 group's batch or not at all (learner.escort): dynamic filtering drops
    an all-wrong group, and with it the groups of its verified corrections."""
    groups, stats, _, _ = _run([["x x"] * 4, ["a b"], ["x x"], ["a b"], ["x x"], ["a b"] * 3, ["a b"] * 3],
                               filtering=True)
    assert groups == [] and stats.filtered_zero_variance == 1
    assert stats.corrections_kept == 2 and stats.layer2_unsent == 2


def test_five_metrics_on_a_fixed_batch():
    t1 = [True, True, False, False, False, True, False, False]
    t2 = [True, False, True, True, False, True, False, True]
    m = mgrpo.accuracy(t1, t2)
    assert m == pytest.approx({"acc_t1": 3 / 8, "acc_t2": 5 / 8, "delta_t1_t2": 2 / 8,
                               "delta_i2c": 3 / 8, "delta_c2i": 1 / 8})
    assert m["delta_t1_t2"] == pytest.approx(m["delta_i2c"] - m["delta_c2i"])


def test_learner_step_record_carries_the_five_metrics():
    from streamrl.comm.codec import ScoredGroup
    from streamrl.learner import stepstats
    from streamrl.learner.batch import collate

    def group(rs, corr, layer=1):
        return ScoredGroup.from_samples(prompt_id="p", policy_version=0, actor_id="a", prompt_tokens=[1],
                                        completions=[[2]] * 4, logprobs=[[-0.1]] * 4, rewards=rs,
                                        finish_reasons=["stop"] * 4, corrections=corr, layer=layer)

    batch = collate([group([1, 1, 0, 0], [1, 0, 1, 0]), group([0, 0.5, 1, 0], [1, 1, 1, 0]),
                     group([1, 0, 0, 0], None, layer=2)], pad_id=0)
    m = stepstats.mgrpo_metrics(batch, r_min_correct=1.0)
    # layer 1 pairs: t1 = 1 1 0 0 | 0 0 1 0, t2 = 1 0 1 0 | 1 1 1 0
    assert m == pytest.approx({"acc_t1": 3 / 8, "acc_t2": 5 / 8, "delta_t1_t2": 2 / 8, "delta_i2c": 3 / 8,
                               "delta_c2i": 1 / 8, "layer2_groups": 1, "layer2_reward_mean": 0.25})
    assert stepstats.mgrpo_metrics(collate([group([1, 0, 0, 0], None)], pad_id=0), 1.0) == {}
    assert torch.equal(batch.layers, torch.tensor([1, 1, 2]))


def test_a_wrong_augment_is_refused_with_why():
    from streamrl import config

    with pytest.raises(config.ConfigError, match="mgrpo.augment=3: must be actors.group_size - 1 = 7"):
        config.load(None, ["mgrpo.enabled=true", "mgrpo.augment=3"])


def test_eval_reports_the_five_metrics_under_mgrpo():
    from streamrl import config, evaluation
    from streamrl.tasks import rewards as rewards_lib

    cfg = config.load(None, ["mgrpo.enabled=true", "eval.prompts=6", "eval.samples=4", "eval.ks=[1,4]"])
    out = evaluation.Evaluator(cfg, rewards_lib.build(cfg)).run()
    assert {"eval/acc_t1", "eval/acc_t2", "eval/delta_t1_t2", "eval/delta_i2c", "eval/delta_c2i"} <= set(out)
    assert out["eval/delta_t1_t2"] == pytest.approx(out["eval/delta_i2c"] - out["eval/delta_c2i"])
    assert out["eval/acc_t1"] == pytest.approx(out["eval/pass@1"])  # the same samples, counted the same way


# --- layer-2 groups join the batch beside the layer-1 groups (issue 26, item 5) -----------------------

def _wire_group(layer: int, version: int = 0, prompt_id: str = "", actor_id: str = "a"):
    from streamrl.comm.codec import ScoredGroup

    return ScoredGroup.from_samples(prompt_id=prompt_id or f"p/{layer}", policy_version=version, actor_id=actor_id, prompt_tokens=[1],
                                    completions=[[2]] * 2, logprobs=[[-1.0]] * 2, rewards=[0.0, 1.0],
                                    finish_reasons=["stop"] * 2, layer=layer)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("ranks, dropped", [(1, 0), (2, 1)])
def test_a_batch_is_n_layer1_groups_plus_the_layer2_groups_sent_before_each(ranks, dropped):
    import zmq

    from streamrl.comm.control import ControlServer
    from streamrl.comm.groups import GroupReceiver, GroupSender
    from streamrl.comm.weights.publisher import WeightPublisher
    from streamrl.learner.intake import Intake

    ctx = zmq.Context()
    receiver = GroupReceiver(ctx, "tcp://127.0.0.1:*", hwm=64, max_bytes=1 << 20, vocab_size=32)
    publisher = WeightPublisher(ctx, "tcp://127.0.0.1:*", 1 << 20)
    control = ControlServer(ctx, "tcp://127.0.0.1:*", publisher)
    sender = GroupSender(ctx, receiver.sock.getsockopt_string(zmq.LAST_ENDPOINT), hwm=64, actor_id="a")
    try:
        intake = Intake(receiver, control, group_size=2, max_staleness=0, strict=True, ranks=ranks)
        # two generate calls at version 0, each as an actor sends it: each layer-1 group after its layer-2 groups
        for layers in ([2, 2, 1, 2, 1], [2, 1, 2, 1]):
            assert sender.send_batch([_wire_group(layer) for layer in layers], timeout_s=2)
        batch, _ = intake.collect(version=0, n=4, timeout_s=10)
        assert sum(g.layer == 1 for g in batch) == 4                  # the batch's layer-1 groups: n, as before
        assert sum(g.layer == 2 for g in batch) == 5 - dropped        # every correction group added, none displacing
        assert len(batch) % ranks == 0 and intake.dropped["layer2_uneven_ranks"] == dropped
        assert intake.used == len(batch)
    finally:
        for sock in (sender, receiver, control, publisher):
            sock.close()
        ctx.term()


@pytest.fixture
def wired():
    """(sender, make_intake(max_staleness)) on live sockets."""
    import zmq

    from streamrl.comm.control import ControlServer
    from streamrl.comm.groups import GroupReceiver, GroupSender
    from streamrl.comm.weights.publisher import WeightPublisher
    from streamrl.learner.intake import Intake

    from streamrl.learner.pacing import Pacer

    ctx = zmq.Context()
    receiver = GroupReceiver(ctx, "tcp://127.0.0.1:*", hwm=64, max_bytes=1 << 20, vocab_size=32)
    publisher = WeightPublisher(ctx, "tcp://127.0.0.1:*", 1 << 20)
    control = ControlServer(ctx, "tcp://127.0.0.1:*", publisher)
    socks = [receiver, control, publisher]

    def sender(actor_id: str) -> GroupSender:
        socks.insert(0, GroupSender(ctx, receiver.sock.getsockopt_string(zmq.LAST_ENDPOINT), hwm=64,
                                    actor_id=actor_id))
        return socks[0]

    def make(max_staleness: int, paced: bool = False) -> Intake:
        intake = Intake(receiver, control, group_size=2, max_staleness=max_staleness)
        if paced:  # two actors, a share of 1 of each batch of 2
            intake.pacer = Pacer(config.load(None, ["learner.batch_groups=2", "actors.num=2", "actors.group_size=2",
                                                    f"max_staleness={max_staleness}"]), control)
        return intake

    yield sender, make
    for sock in socks:
        sock.close()
    ctx.term()


def _call(version: int, *spec: str, actor: str = "a"):
    """One generate call's groups as an actor sends them: 'x' a layer-1 group of prompt x, 'x/t2' its layer-2 one."""
    return [_wire_group(2 if "/t2" in s else 1, version, s, actor) for s in spec]


@pytest.mark.timeout(30)
def test_a_call_split_between_two_batches_trains_each_layer2_group_in_its_layer1_groups_batch(wired):
    sender, make = wired
    intake = make(max_staleness=1)
    assert sender("a").send_batch(_call(0, "a/t2", "a", "b/t2", "b/t2", "b", "c/t2", "c"), timeout_s=2)
    first, _ = intake.collect(version=0, n=2, timeout_s=10)
    assert [g.prompt_id for g in first] == ["a/t2", "a", "b/t2", "b/t2", "b"]
    second, _ = intake.collect(version=1, n=1, timeout_s=10)
    assert [g.prompt_id for g in second] == ["c/t2", "c"]   # not trained a step early, beside a and b
    assert intake.used == 7 and not intake.dropped


@pytest.mark.timeout(30)
def test_a_layer2_group_is_dropped_with_its_stale_layer1_group_and_counted(wired):
    sender, make = wired
    intake, a = make(max_staleness=0), sender("a")
    assert a.send_batch(_call(0, "a/t2", "a", "b/t2", "b"), timeout_s=2)
    first, _ = intake.collect(version=0, n=1, timeout_s=10)
    assert a.send_batch(_call(1, "c/t2", "c"), timeout_s=2)
    second, _ = intake.collect(version=1, n=1, timeout_s=10)
    assert [g.prompt_id for g in first] == ["a/t2", "a"] and [g.prompt_id for g in second] == ["c/t2", "c"]
    assert intake.dropped == {"stale": 2}   # b and its layer-2 group
    assert intake.received == intake.used + sum(intake.dropped.values())


@pytest.mark.timeout(30)
def test_a_layer2_group_shares_its_layer1_groups_fate_whatever_refused_that_one(wired):
    """The intake's verdicts that look at a layer-1 group alone (task.epochs' not_dealt, a wrong group size) drop its
    layer-2 groups with it: they never train without the group whose responses they correct."""
    from streamrl.comm.codec import ScoredGroup

    sender, make = wired
    intake, a = make(max_staleness=0), sender("a")
    odd = ScoredGroup.from_samples(prompt_id="b", policy_version=0, actor_id="a", prompt_tokens=[1],
                                   completions=[[2]] * 3, logprobs=[[-1.0]] * 3, rewards=[0.0, 1.0, 1.0],
                                   finish_reasons=["stop"] * 3)
    assert a.send_batch([*_call(0, "b/t2"), odd, *_call(0, "c/t2", "c")], timeout_s=2)
    batch, _ = intake.collect(version=0, n=1, timeout_s=10)
    assert [g.prompt_id for g in batch] == ["c/t2", "c"]
    assert intake.dropped == {"wrong_group_size": 2}


@pytest.mark.timeout(30)
def test_a_layer1_group_held_past_its_actors_share_keeps_its_layer2_groups_with_it(wired):
    sender, make = wired
    intake = make(max_staleness=1, paced=True)
    assert sender("actor-0").send_batch(_call(0, "a/t2", "a", "b/t2", "b", "c/t2", "c", actor="actor-0"), timeout_s=2)
    actor1 = sender("actor-1")
    assert actor1.send_batch(_call(0, "d", actor="actor-1"), timeout_s=2)
    first, _ = intake.collect(version=0, n=2, timeout_s=10)
    assert sorted(g.prompt_id for g in first) == ["a", "a/t2", "d"]   # b's and c's corrections wait with them
    assert actor1.send_batch(_call(1, "e", actor="actor-1"), timeout_s=2)
    second, _ = intake.collect(version=1, n=2, timeout_s=10)
    assert sorted(g.prompt_id for g in second) == ["b", "b/t2", "e"]
    assert intake.received == intake.used + len(intake.held) + len(intake.receiver.pending)


def test_a_generate_call_sends_every_layer2_group_just_ahead_of_its_layer1_group():
    """Generation returns every layer-2 group a call made (no share of the budget, no trim), each just ahead of the
    layer-1 group whose responses it corrects; the actor charges its throttle for the layer-1 ones only (tests/integration/test_mgrpo_runs.py:
    every strict step holds batch_groups layer-1 groups and one layer-2 group per verified correction)."""
    from streamrl import config
    from streamrl.actors.generation import Generation
    from streamrl.telemetry import actor_metrics, prometheus_metrics

    cfg = config.load(None, ["mgrpo.enabled=true", "task.num_symbols=2", "task.length=2", "actors.group_size=4",
                             "actors.prompts_per_generate=4", "advantage.r_min_correct=1.0"])
    tok = Words()
    script = [["a b", "a x", "x x", "b a"]] * 4 + [["a b"]] * 16 + [["a b"] * 3] * 16
    backend = Scripted(tok, script)
    reward = rewards.Reward(symbols.Copy(2, 2))
    reward.task.sample = lambda rng: tasks.Prompt(id="p", text="copy : a b =", target=("a", "b"))
    gen = Generation(cfg, 0, 0, backend, tok, reward,
                     actor_metrics.ActorMetrics(prometheus_metrics.new_registry(), "t", "actor-0"))
    groups = gen(4, 0, None)
    assert [g.layer for g in groups] == ([2] * 4 + [1]) * 4   # corrections first: they reach the learner before
    assert "over_budget" not in gen.report()


# --- a layer-2 query longer than the model's context (issue 17, item 6) ----------------------------

def test_cap_query_keeps_the_query_and_the_end_and_counts_the_cut():
    ids = list(range(20))
    assert mgrpo.cap_query(ids, 0, 5) == (ids, 0) and mgrpo.cap_query(ids, 20, 5) == (ids, 0)
    capped, cut = mgrpo.cap_query(ids, 12, 5)
    assert capped == [0, 1, 2, 3, 4, *range(13, 20)] and cut == 8
    assert mgrpo.cap_query(ids, 6, 5) == ([0, 1, 2, 17, 18, 19], 14)   # the query keeps at most half


def test_layer2_queries_over_the_limit_are_capped_in_the_rollout_and_counted():
    tok = Words()
    prompt = tasks.Prompt(id="p0", text="copy : a b =", target=("a", "b"))
    opts = rollout.RolloutOptions(group_size=4, r_min_correct=1.0, phrases=("Wait, check.",), augment=3,
                                  query_limit=7)
    backend = Scripted(tok, [LAYER1, *CORRECTIONS, ["a b"] * 3, ["a b"] * 3, ["a b"] * 3])
    groups, stats = rollout.make_groups(backend, tok, rewards.Reward(symbols.Copy(4, 2)), [prompt], opts, 7,
                                        "actor-0", random.Random(0))
    # each query is "copy : a b = <2 words>\nWait, check." = 9 words: 2 cut from the middle of each of 4
    assert (stats.queries_capped, stats.query_tokens_cut) == (4, 8)
    for g in groups:
        if g.layer == 2:
            assert len(g.prompt_tokens) == 7 and tok.decode(g.prompt_tokens[:3].tolist()) == "copy : a"


def test_query_limit_is_the_context_minus_the_corrections_minimum_room(tmp_path):
    import json

    from streamrl import config
    from streamrl.models.context import seq_cap

    def limit(cfg) -> int:  # as the actors ask it
        return mgrpo.query_limit(cfg, seq_cap(cfg.model) or 0)

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    cfg = config.load(None, ["mgrpo.enabled=true", f"model.path={tmp_path}", "actors.max_new_tokens=8196"])
    assert seq_cap(cfg.model) == 4096 and limit(cfg) == 4096 - 512   # not 4096 - 8196 floored at 1
    cfg = config.load(None, ["mgrpo.enabled=true", f"model.path={tmp_path}", "mgrpo.min_correction_tokens=1000",
                              "actors.max_new_tokens=8196"])
    assert limit(cfg) == 3096
    assert limit(config.load(None, ["mgrpo.enabled=true", "mgrpo.max_query_tokens=50"])) == 50
    assert limit(config.load(None, ["mgrpo.enabled=true", "model.max_seq_len=200"])) == 200 - 4
    # the tiny model: its context (256) minus the room, which is at most the completion cap
    assert limit(config.load(None, ["mgrpo.enabled=true", "actors.max_new_tokens=6"])) == 250
    assert limit(config.load(None, ["mgrpo.enabled=true", "model.path=org/hub-id"])) == 0


def test_layer2_coverage_counts_steps_from_the_first_verified_correction_on():
    steps = [(0, 0, 0.0), (1, 0, 0.0), (2, 0, 0.125), (3, 2, 0.0), (4, 0, 0.0), (5, 4, 0.25)]
    # step 2: a layer-1 sample's correction verified (its layer-2 group went to another step); 2 of 4 trained layer 2
    assert mgrpo.layer2_coverage(steps) == {"first_correction_step": 2, "steps_since": 4, "steps_with_layer2": 2,
                                            "share": 0.5, "layer2_groups": 6}
    assert mgrpo.layer2_coverage(steps[:2])["first_correction_step"] is None


def test_the_summary_says_how_many_steps_trained_layer2_once_corrections_existed(tmp_path):
    from streamrl import config
    from streamrl.learner.runlog import RunLog

    cfg = config.load(None, ["mgrpo.enabled=true", f"run_dir={tmp_path}"])
    log = RunLog(cfg)
    log.open(resumed_step=0)
    for step, n2, acc2 in [(0, 0, 0.0), (1, 1, 0.0), (2, 0, 0.0), (3, 3, 0.1)]:
        log.step({"step": step, "reward_mean": 0.0, "step_s": 0.1, "layer2_groups": n2, "acc_t2": acc2})
    summary = log.summary({}, (0.0, 1.0))
    log.close()
    assert summary["mgrpo_layer2"] == {"first_correction_step": 1, "steps_since": 3, "steps_with_layer2": 2,
                                       "share": 2 / 3, "layer2_groups": 4}
