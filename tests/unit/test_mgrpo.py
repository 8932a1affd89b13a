"""Multi-layer GRPO: layer-2 queries, verified corrections, augmentation and the five metrics."""

from __future__ import annotations

import random

import pytest
import torch

from streamrl import tasks
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
        return " ".join(inv[t] for t in tokens)


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
            out.append([Completion(self.tok(t)["input_ids"], [-0.5] * len(t.split()), "stop") for t in texts])
        return out


def _run(script, group_size=4, augment=3, prompt_text="copy : a b =", target=("a", "b")):
    tok = Words()
    prompt = tasks.Prompt(id="p0", text=prompt_text, target=target)
    opts = rollout.RolloutOptions(group_size=group_size, r_min_correct=1.0, phrases=PHRASES, augment=augment)
    backend = Scripted(tok, script)
    groups, stats = rollout.make_groups(backend, tok, rewards.Reward(symbols.Copy(4, len(target))), [prompt], opts,
                                        7, "actor-0", random.Random(0))
    return groups, stats, backend, tok


LAYER1 = ["a b", "a x", "x x", "b a"]          # rewards 1, 0.5, 0, 0
CORRECTIONS = [["a b"], ["a b"], ["x b"], ["a b"]]  # responses 0, 1, 3 corrected right; 2 not


def test_layer2_queries_are_query_response_and_a_phrase_from_the_pool():
    groups, _, _, tok = _run([LAYER1, *CORRECTIONS, ["a b", "a a", "b b"], ["a b"] * 3, ["x x"] * 3])
    queries = [t for t in tok.encoded if "\n" in t]
    assert len(queries) == 4
    for response, q in zip(LAYER1, queries):
        head, phrase = q.split("\n")
        assert head == f"copy : a b = {response}" and phrase in PHRASES
    layer2 = [g for g in groups if g.layer == 2]
    expected = [tok(q)["input_ids"] for q in (queries[0], queries[1], queries[3])]
    assert [g.prompt_tokens.tolist() for g in layer2] == expected


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


def test_five_metrics_on_a_fixed_batch():
    t1 = [True, True, False, False, False, True, False, False]
    t2 = [True, False, True, True, False, True, False, True]
    m = mgrpo.accuracy(t1, t2)
    assert m == pytest.approx({"acc_t1": 3 / 8, "acc_t2": 5 / 8, "delta_t1_t2": 2 / 8,
                               "delta_i2c": 3 / 8, "delta_c2i": 1 / 8})
    assert m["delta_t1_t2"] == pytest.approx(m["delta_i2c"] - m["delta_c2i"])


def test_learner_step_record_carries_the_five_metrics():
    from streamrl.comm.wire import ScoredGroup
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


# --- how the two layers share an actor's budget (issue 17, item 1) ---------------------------------

class _G:
    def __init__(self, layer, name):
        self.layer, self.name = layer, name


def _call(prompts: int, kept_per_prompt: int) -> list:
    """One generate call's groups as rollout.make_groups returns them: layer 1 first, then layer 2."""
    return ([_G(1, f"p{i}") for i in range(prompts)]
            + [_G(2, f"p{i}/t2/{j}") for i in range(prompts) for j in range(kept_per_prompt)])


def test_layer2_trains_at_the_mgrpo_papers_batch_shape():
    from pathlib import Path

    from streamrl import config
    from streamrl.algo import staleness

    cfg = config.load(Path(__file__).resolve().parents[2] / "configs" / "mgrpo" / "qwen2.5-math-7b.yaml")
    assert cfg.strict and (cfg.learner.batch_groups, cfg.actors.num, cfg.actors.prompts_per_generate) == (32, 8, 8)
    step = []
    for index in range(cfg.actors.num):   # strict: each actor makes exactly its share of one batch per version
        budget = staleness.planned_share(cfg.learner.batch_groups, cfg.actors.num, index)
        groups = _call(min(cfg.actors.prompts_per_generate, budget), kept_per_prompt=3)
        sent = mgrpo.fill_budget(groups, budget, cfg.mgrpo.layer2_share)
        assert len(sent) == budget == 4
        step += sent
    layer2 = sum(g.layer == 2 for g in step)
    assert len(step) == 32 and layer2 == 16   # a layer-1-first trim sent 0 here: every budget held 4 layer-1 groups
    # one correction kept in the whole call still trains
    assert [g.layer for g in mgrpo.fill_budget(_call(4, 0) + [_G(2, "x")], 4, 0.5)] == [1, 1, 1, 2]


@pytest.mark.parametrize("budget, prompts, kept, share, layers", [
    (4, 4, 3, 0.5, [1, 1, 2, 2]),
    (4, 4, 3, 0.25, [1, 1, 1, 2]),
    (4, 4, 3, 0.0, [1, 1, 1, 1]),
    (4, 4, 3, 1.0, [2, 2, 2, 2]),
    (4, 1, 3, 0.5, [1, 2, 2, 2]),    # layer 1 cannot fill its two slots: layer 2 takes the spare one
    (1, 1, 3, 0.5, [1]),             # a budget of one cannot be split: layer 1
    (8, 2, 1, 0.5, [1, 1, 2, 2]),    # everything fits: nothing is cut
])
def test_fill_budget_shares_slots_by_the_configured_share(budget, prompts, kept, share, layers):
    sent = mgrpo.fill_budget(_call(prompts, kept), budget, share)
    assert [g.layer for g in sent] == layers
    names = [g.name for g in sent]
    assert names == sorted(names, key=[g.name for g in _call(prompts, kept)].index)   # order kept


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


def test_query_limit_comes_from_the_model_folder_or_the_config(tmp_path):
    import json

    from streamrl import config

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    cfg = config.load(None, ["mgrpo.enabled=true", f"model.path={tmp_path}", "actors.max_new_tokens=1000"])
    assert mgrpo.query_limit(cfg) == 3096
    assert mgrpo.query_limit(config.load(None, ["mgrpo.enabled=true", "mgrpo.max_query_tokens=50"])) == 50
    # the tiny model: its context (256) minus the completion cap
    assert mgrpo.query_limit(config.load(None, ["mgrpo.enabled=true", "actors.max_new_tokens=6"])) == 250


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
