import itertools
import random

import pytest

from streamrl import tasks
from streamrl.actors import rollout
from streamrl.actors.backends import Completion
from streamrl.algo import group_filters
from streamrl.tasks import rewards, symbols


def _variance(xs):
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)


@pytest.mark.parametrize("seed", range(30))
def test_max_variance_subset_matches_brute_force(seed):
    rng = random.Random(seed)
    n, k = rng.randint(2, 9), None
    k = rng.randint(1, n)
    r = [rng.choice([0.0, 0.25, 0.5, 0.75, 1.0]) for _ in range(n)]
    best = max(_variance([r[i] for i in c]) for c in itertools.combinations(range(n), k))
    picked = group_filters.max_variance_subset(r, k)
    assert len(picked) == k == len(set(picked)) and picked == sorted(picked)
    assert _variance([r[i] for i in picked]) == pytest.approx(best)


def test_max_variance_subset_keeps_both_extremes():
    r = [0.5, 0.5, 0.0, 0.5, 1.0, 0.25, 0.5, 0.75]
    assert group_filters.max_variance_subset(r, 4) == [2, 4, 5, 7]  # 0.0, 1.0 and the next-outermost pair


def test_max_variance_subset_rejects_a_k_it_cannot_fill():
    with pytest.raises(ValueError, match="k=5: must be in 1..4"):
        group_filters.max_variance_subset([0, 1, 0, 1], 5)


def test_diversity_needs_a_correct_and_a_failed_sample():
    assert group_filters.diverse([0.0, 0.75], 0.75)
    assert not group_filters.diverse([0.0, 0.5], 0.75)      # none correct
    assert not group_filters.diverse([0.75, 1.0], 0.75)     # none failed
    assert group_filters.zero_variance([0.5] * 4) and not group_filters.zero_variance([0.5, 0.5, 0.25])


class ScriptedBackend:
    """Follows actors.backends.Backend: each call returns the next scripted completions for each prompt.
    A completion's single token is the index of a word in `words`; the copy task scores the word."""

    def __init__(self, script):
        self.script, self.calls = list(script), []

    def generate(self, prompts, n):
        self.calls.append(len(prompts))
        out = []
        for _ in prompts:
            words = self.script.pop(0)
            assert len(words) == n
            out.append([Completion([w], [-1.0], "stop") for w in words])
        return out


class WordTokenizer:
    def __init__(self, words):
        self.words = words

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [0, 1]}

    def decode(self, tokens, skip_special_tokens=True):
        return " ".join(self.words[t] for t in tokens)


def _opts(group_size, **kw):
    return rollout.RolloutOptions(group_size=group_size, r_min_correct=1.0, **kw)


def _copy_setup(script):
    task = symbols.Copy(num_symbols=4, length=1)       # rewards 0 or 1: one symbol to copy
    prompt = tasks.Prompt(id="p", text="copy : a =", target=("a",))
    return ScriptedBackend(script), WordTokenizer(["a", "b"]), rewards.Reward(task), prompt


def test_dynamic_rollouts_sample_more_until_a_group_is_diverse_then_keep_the_most_varied():
    # Round 1: all fail (b b b b). Round 2: one success appears. Then it stops: 8 samples, keep 4.
    backend, tok, reward, prompt = _copy_setup([[1, 1, 1, 1], [1, 0, 1, 1]])
    groups, stats = rollout.make_groups(backend, tok, reward, [prompt], _opts(4, rollout_factor=5), 3, "actor-0")
    assert backend.calls == [1, 1] and stats.extra_samples == 4
    # The one success survives the subsample (it is the group's only source of variance).
    assert sorted(groups[0].rewards) == [0.0, 0.0, 0.0, 1.0]
    assert groups[0].policy_version == 3


def test_dynamic_rollouts_stop_at_the_factor_when_diversity_never_comes():
    backend, tok, reward, prompt = _copy_setup([[1, 1]] * 3)
    groups, stats = rollout.make_groups(backend, tok, reward, [prompt], _opts(2, rollout_factor=3), 0, "a")
    assert backend.calls == [1, 1, 1] and stats.extra_samples == 4
    assert groups[0].rewards == [0.0, 0.0]


def test_zero_variance_groups_are_filtered_and_counted():
    task = symbols.Copy(num_symbols=4, length=1)
    prompts = [tasks.Prompt(id=str(i), text="x", target=("a",)) for i in range(3)]
    backend = ScriptedBackend([[0, 0], [0, 1], [1, 1]])
    groups, stats = rollout.make_groups(backend, WordTokenizer(["a", "b"]), rewards.Reward(task), prompts,
                                        _opts(2, filter_zero_variance=True), 0, "a")
    assert [g.prompt_id for g in groups] == ["1"] and stats.filtered_zero_variance == 2


@pytest.mark.parametrize("estimator, want_before, want_after", [   # R_min_correct = 1: A = 0 for a correct sample
    ("static", [0, 3, 0, 3], [0, 1, 0, 1]),                         # under static and CoRPO (baseline 1)
    ("corpo", [0, 3, 0, 3], [0, 1, 0, 1]),
    ("grpo", [0, 3, 1, 2], [0, 1, 1, 0]),
])
def test_the_census_is_counted_before_and_after_dynamic_filtering(estimator, want_before, want_after):
    task = symbols.Copy(num_symbols=4, length=1)
    prompts = [tasks.Prompt(id=str(i), text="x", target=("a",)) for i in range(3)]
    backend = ScriptedBackend([[1, 1], [0, 1], [0, 0]])   # rewards [0, 0] (filtered), [1, 0], [1, 1] (filtered)
    _, stats = rollout.make_groups(backend, WordTokenizer(["a", "b"]), rewards.Reward(task), prompts,
                                   _opts(2, filter_zero_variance=True, estimator=estimator), 0, "a")
    before = [stats.census_before_failed_pos, stats.census_before_failed_nonpos, stats.census_before_passed_pos,
              stats.census_before_passed_nonpos]
    after = [stats.census_after_failed_pos, stats.census_after_failed_nonpos, stats.census_after_passed_pos,
             stats.census_after_passed_nonpos]
    assert before == want_before   # every sample generated: 6
    assert after == want_after     # the one group sent, [1, 0]


def test_online_difficulty_filtering_stops_drawing_excluded_prompts_and_sees_filtered_groups():
    from streamrl.algo.difficulty import SuccessTracker

    tracker = SuccessTracker(rollouts=2, low=0.1, high=0.9)
    task = symbols.Copy(num_symbols=2, length=1)                  # prompt ids: copy-a, copy-b
    prompts = [tasks.Prompt(id="copy-a", text="x", target=("a",))]
    backend = ScriptedBackend([[0, 0]])                         # both right: too easy after 2 samples
    groups, stats = rollout.make_groups(backend, WordTokenizer(["a", "b"]), rewards.Reward(task), prompts,
                                        _opts(2, filter_zero_variance=True), 0, "a",
                                        observe=lambda pid, rs: tracker.observe(pid, rs, 1.0))
    assert groups == [] and stats.filtered_zero_variance == 1 and not tracker.keep("copy-a")
    drawn = rollout.sample_prompts(task, random.Random(0), 5, keep=tracker.keep)
    assert len(drawn) == 5 and {p.id for p in drawn} == {"copy-b"}


@pytest.mark.parametrize("estimator", ["static", "corpo", "grpo"])
def test_the_learner_logs_the_census_before_filtering_that_the_actor_counted(estimator):
    """Filtered groups ride on the next group sent (a call that sends nothing passes them on), and the learner's
    census_before_* over the step's groups equals the actor's count over every sample it generated."""
    from streamrl.actors.generation import carry_filtered
    from streamrl.algo import advantages
    from streamrl.learner import stepstats
    from streamrl.learner.batch import collate

    task = symbols.Copy(num_symbols=4, length=1)
    tok, reward, opts = WordTokenizer(["a", "b"]), rewards.Reward(task), _opts(2, filter_zero_variance=True,
                                                                               estimator=estimator)
    prompts = [tasks.Prompt(id=str(i), text="x", target=("a",)) for i in range(3)]
    # call 1 filters both groups and sends nothing; call 2 filters one of three and sends two
    sent, unsent, before = [], None, [0, 0, 0, 0]
    for script, ps in (([[0, 0], [1, 1]], prompts[:2]), ([[1, 1], [0, 1], [1, 0]], prompts)):
        groups, stats = rollout.make_groups(ScriptedBackend(script), tok, reward, ps, opts, 0, "a")
        unsent = carry_filtered(groups, stats, unsent)
        sent += groups
        before = [b + getattr(stats, f"census_before_{c}") for b, c in zip(before, ("failed_pos", "failed_nonpos",
                                                                                    "passed_pos", "passed_nonpos"))]
    assert unsent is None and len(sent) == 2 and sent[0].filtered.groups == 3 and sent[1].filtered is None
    batch = collate(sent, pad_id=0)
    adv = advantages.compute(batch.rewards, estimator, 1.0)
    got = stepstats.before_filtering(batch.rewards, adv, 1.0, [g.filtered for g in sent])
    assert got["groups_filtered"] == 3
    n = sum(before)
    assert n == 10   # every sample generated: 5 groups of 2
    assert [got[f"census_before_{c}"] for c in ("failed_pos", "failed_nonpos", "passed_pos", "passed_nonpos")] == \
        pytest.approx([b / n for b in before])
    # nothing filtered: the census before equals the one after
    plain = stepstats.before_filtering(batch.rewards, adv, 1.0, [None, None])
    from streamrl.algo import learning_signal
    after = learning_signal.census(batch.rewards, adv, 1.0)
    assert plain["groups_filtered"] == 0
    assert {k.replace("census_before_", "census_"): v for k, v in plain.items() if k != "groups_filtered"} == after
