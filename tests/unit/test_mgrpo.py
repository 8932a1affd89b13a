"""Multi-layer GRPO: layer-2 queries, verified corrections, augmentation and the five metrics."""

from __future__ import annotations

import random

import pytest
import torch

from actors import rollout
from actors.backends import Completion
from streamrl import mgrpo, rewards, tasks
from streamrl.tasks import symbols

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
    from learner import stepstats
    from learner.batch import collate
    from streamrl.wire import ScoredGroup

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
    from streamrl import rewards as rewards_lib

    cfg = config.load(None, ["mgrpo.enabled=true", "eval.prompts=6", "eval.samples=4", "eval.ks=[1,4]"])
    out = evaluation.Evaluator(cfg, rewards_lib.build(cfg)).run()
    assert {"eval/acc_t1", "eval/acc_t2", "eval/delta_t1_t2", "eval/delta_i2c", "eval/delta_c2i"} <= set(out)
    assert out["eval/delta_t1_t2"] == pytest.approx(out["eval/delta_i2c"] - out["eval/delta_c2i"])
    assert out["eval/acc_t1"] == pytest.approx(out["eval/pass@1"])  # the same samples, counted the same way
