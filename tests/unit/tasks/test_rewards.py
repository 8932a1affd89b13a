import math

import pytest

from streamrl import config, tasks
from streamrl.tasks import rewards, symbols


@pytest.mark.parametrize("r, shaped", [
    (0.0, 0.0), (0.29, 0.0), (0.3, 1 / 3),     # an edge belongs to the bucket above it
    (0.59, 1 / 3), (0.6, 2 / 3), (0.89, 2 / 3), (0.9, 1.0), (1.0, 1.0),
])
def test_bucketing_puts_each_edge_in_the_bucket_above(r, shaped):
    assert rewards.bucket(r, [0.3, 0.6, 0.9], rewards.even_values(4)) == pytest.approx(shaped)


def test_ten_step_scale_condensed_to_four_levels():
    verifier = tasks.TASKS.get("code_verifier")(scale_steps=10, reward_form="exp")
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


def test_r_min_correct_must_be_a_level_of_the_shaped_scale():
    with pytest.raises(config.ConfigError, match=r"r_min_correct=2.0: not a level .*; allowed: 1.0$"):
        config.load(None, ["reward.bucket_edges=[0.5]", "reward.bucket_values=[-1, 1]", "advantage.r_min_correct=2"])
    with pytest.raises(config.ConfigError, match=r"r_min_correct=0.0: not a level .*; allowed: 0.25, 0.5, 0.75, 1.0"):
        config.load(None, ["advantage.r_min_correct=0"])   # the lowest level: every sample would be correct
    assert config.load(None, ["reward.bucket_edges=[0.5]", "reward.bucket_values=[-1, 1]",
                              "advantage.r_min_correct=1"]).advantage.r_min_correct == 1


def test_four_step_scale_refuses_a_threshold_between_its_levels():
    # 0.6 lies between 1/3 and 2/3: static advantages would be R - 0.6 and CoRPO would switch phase at 0.6.
    with pytest.raises(config.ConfigError) as e:
        config.load(None, ["task.name=code_verifier", "task.reward_form=exp", "reward.bucket_edges=[0.3,0.6,0.9]",
                           "advantage.r_min_correct=0.6"])
    assert str(e.value).count("\n") == 0
    assert "advantage.r_min_correct=0.6: not a level" in str(e.value)
    assert str(e.value).endswith("allowed: 0.3333333333333333, 0.6666666666666666, 1.0")
    cfg = config.load(None, ["task.name=code_verifier", "task.reward_form=exp", "reward.bucket_edges=[0.3,0.6,0.9]",
                             "advantage.r_min_correct=0.6666666666666666"])
    assert cfg.advantage.r_min_correct in cfg.reward_levels()


def test_a_threshold_within_float_noise_of_a_level_is_snapped_to_it():
    cfg = config.load(None, ["task.name=code_verifier", "reward.bucket_edges=[0.3,0.6,0.9]",
                             "advantage.r_min_correct=-0.405465108108"])   # ln(2/3), as a person types it
    assert cfg.advantage.r_min_correct == math.log(2 / 3)
    assert cfg.advantage.r_min_correct in cfg.reward_levels()


def test_shaped_levels_from_the_config_match_the_built_reward():
    for overrides in (["task.name=code_verifier", "advantage.r_min_correct=0"],
                      ["task.name=code_verifier", "task.reward_form=exp", "advantage.r_min_correct=0.6"],
                      ["task.name=code_verifier", "reward.bucket_edges=[0.3,0.6,0.9]",
                       f"advantage.r_min_correct={math.log(2 / 3)!r}"],
                      ["task.length=6", "advantage.r_min_correct=0.5"]):
        cfg = config.load(None, overrides)
        assert cfg.reward_levels() == rewards.build(cfg).levels


def test_the_paper_configs_threshold_is_a_level():
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[3] / "configs").rglob("*.yaml")):
        cfg = config.load(path)
        assert cfg.advantage.r_min_correct in cfg.reward_levels()[1:], path
