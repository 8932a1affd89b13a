import pytest

from streamrl import config, rewards, tasks
from streamrl.tasks import symbols


@pytest.mark.parametrize("r, shaped", [
    (0.0, 0.0), (0.29, 0.0), (0.3, 1 / 3),     # an edge belongs to the bucket above it
    (0.59, 1 / 3), (0.6, 2 / 3), (0.89, 2 / 3), (0.9, 1.0), (1.0, 1.0),
])
def test_bucketing_puts_each_edge_in_the_bucket_above(r, shaped):
    assert rewards.bucket(r, [0.3, 0.6, 0.9], rewards.even_values(4)) == pytest.approx(shaped)


def test_ten_step_scale_condensed_to_four_levels():
    verifier = tasks.TASKS.get("code_verifier")(scale_steps=10)
    shaped = rewards.Reward(verifier, [0.3, 0.6, 0.9])
    assert len(verifier.reward_levels) == 11
    assert shaped.levels == pytest.approx([0, 1 / 3, 2 / 3, 1])


def test_custom_bucket_values_are_the_shaped_levels():
    shaped = rewards.Reward(symbols.Copy(4, 4), [0.5], [-1.0, 1.0])
    assert shaped.levels == [-1.0, 1.0]
    p = tasks.Prompt(id="x", text="", target=("a", "b", "c", "d"))
    assert shaped(p, "a b x x") == 1.0 and shaped(p, "a x x x") == -1.0


@pytest.mark.parametrize("edges, values, msg", [
    ([0.5, 0.5], [], "strictly increasing"),
    ([0.5], [0.0, 0.5, 1.0], "needs len"),
    ([0.5], [1.0, 0.0], "ordinal scale"),
])
def test_bad_shaping_is_refused_with_the_reason(edges, values, msg):
    with pytest.raises(ValueError, match=msg):
        rewards.Reward(symbols.Copy(4, 4), edges, values)


def test_r_min_correct_must_lie_on_the_shaped_scale():
    with pytest.raises(config.ConfigError, match=r"r_min_correct=2.0: must lie in \(-1.0, 1.0\]"):
        config.load(None, ["reward.bucket_edges=[0.5]", "reward.bucket_values=[-1, 1]", "advantage.r_min_correct=2"])
    with pytest.raises(config.ConfigError, match=r"r_min_correct=0.0: must lie in \(0.0, 1.0\]"):
        config.load(None, ["advantage.r_min_correct=0"])
    assert config.load(None, ["reward.bucket_edges=[0.5]", "reward.bucket_values=[-1, 1]",
                              "advantage.r_min_correct=1"]).advantage.r_min_correct == 1
