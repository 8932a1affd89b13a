"""task.name: skyrl_gym — SkyRL-Gym envs played through streamrl's Environment protocol with SkyRL's own semantics:
made with (env_config, extras=row), init(prompt) → opening, step(action) → BaseTextEnvStepOutput until done, the
generator's max_turns in the extras, the steps' rewards summed onto the task's levels, failures raised."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

skyrl_gym = pytest.importorskip("skyrl_gym")
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput  # noqa: E402

from streamrl import config  # noqa: E402
from streamrl.tasks import environments  # noqa: E402
from streamrl.tasks.adapted import BadReward  # noqa: E402
from streamrl.tasks.skyrl_adapter import environment_class  # noqa: E402

EXAMPLE = __import__("pathlib").Path(__file__).resolve().parents[3] / "examples" / "skyrl-gym-copy"


def _task(environment: str, levels=(0.0, 1.0), max_turns: int = 2, env_config=None):
    return SimpleNamespace(name="skyrl_gym", environment=environment, env_config=env_config or {},
                           max_turns=max_turns, reward_levels=list(levels), reward_level_tolerance=0.01)


def test_skyrls_own_gsm8k_env_scores_a_reply_unchanged():
    cls = environment_class(_task("gsm8k"))
    prompt = [{"role": "user", "content": "What is 6 * 7?"}]
    row = {"prompt": prompt, "id": "r1", "reward_spec": {"method": "rule", "ground_truth": "42"}}
    env = cls(row)
    assert env.reset() == prompt
    assert env.step("six sevens are #### 42") == ([], 1.0, True)
    wrong = cls(row)
    wrong.reset()
    assert wrong.step("#### 41") == ([], 0.0, True)


def test_the_generators_max_turns_reaches_the_env_and_its_observations_come_back():
    # gsm8k_multi_turn ends at extras["max_turns"] and says what it wants between turns; its rewards are per turn
    cls = environment_class(_task("gsm8k_multi_turn", levels=(), max_turns=3))
    env = cls({"prompt": "What is 6 * 7?", "id": "r", "reward_spec": {"ground_truth": "42"}, "extra_info": {}})
    assert env.env.max_turns == 3
    assert env.reset() == [{"role": "user", "content": "What is 6 * 7?"}]
    messages, reward, done = env.step("no idea")
    assert not done and reward is None and messages[0]["role"] == "user" and "####" in messages[0]["content"]
    env.step("#### 41")
    messages, reward, done = env.step("#### 41")
    assert done and messages == [] and reward == pytest.approx(2 * 0.2 / 3)  # two well-formatted wrong answers: the sum
    right = cls({"prompt": "q", "id": "r", "reward_spec": {"ground_truth": "42"}, "extra_info": {}})
    right.reset()
    right.step("#### 41")
    assert right.step("#### 42") == ([], pytest.approx(0.2 / 3 + 1.0), True)  # the sum of the steps' rewards


def test_the_example_copy_env_by_file_reference_plays_two_turns_and_closes():
    cls = environment_class(_task(f"{EXAMPLE / 'copy_env.py'}:CopyEnv", levels=(0, .25, .5, .75, 1)))
    row = {"prompt": "copy : a b c d =", "id": "x", "reward_spec": {"method": "rule", "ground_truth": "a b c d"}}
    env = cls(row)
    assert env.reset() == [{"role": "user", "content": "copy : a b c d ="}]
    assert env.step("a b") == ([{"role": "user", "content": "next"}], None, False)
    assert env.step("c a") == ([], 0.75, True)
    assert env.closed


class _Flaky(BaseTextEnv):
    def __init__(self, env_config=None, extras={}):
        super().__init__()
        self.what = extras["what"]
        self.closes = 0

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if self.what == "raise":
            raise RuntimeError("env broke")
        if self.what == "not_output":
            return "done"  # type: ignore[return-value]
        reward = {"nan": math.nan, "off": 0.3, "text": "1"}[self.what]
        return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata={})

    def close(self):
        self.closes += 1


@pytest.mark.parametrize("what, error", [("raise", RuntimeError), ("not_output", TypeError), ("nan", BadReward),
                                         ("off", BadReward), ("text", BadReward)])
def test_a_failing_env_or_a_bad_reward_raises_for_the_episode_runner_to_count(what, error):
    skyrl_gym.register(id=f"streamrl-test-flaky-{what}", entry_point=_Flaky)
    cls = environment_class(_task(f"streamrl-test-flaky-{what}"))  # a registered id, made by skyrl_gym.make
    env = cls({"prompt": "q", "id": "r", "what": what})
    env.reset()
    with pytest.raises(error):
        env.step("reply")
    env.close()
    env.close()
    assert env.env.closes == 1


class _NoneOnWrong(BaseTextEnv):
    """Reward None on a wrong answer (SkyRL's type says float; an env returning None could not score it)."""

    def __init__(self, env_config=None, extras={}):
        super().__init__()

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        if self.turns == 1:  # a number on an earlier step: the last step's None still could not score it
            return BaseTextEnvStepOutput(observations=[{"role": "user", "content": "again"}], reward=0.0,
                                         done=False, metadata={})
        return BaseTextEnvStepOutput(observations=[], reward=1.0 if action == "right" else None, done=True,
                                     metadata={})


def test_an_episode_whose_last_step_gave_none_could_not_be_scored_whatever_earlier_steps_gave():
    # It scored 0.0 before, the middle of levels [-1, 0, 1], silently (issue 48).
    skyrl_gym.register(id="streamrl-test-none-on-wrong", entry_point=_NoneOnWrong)
    cls = environment_class(_task("streamrl-test-none-on-wrong", levels=(-1, 0, 1)))
    wrong = cls({"prompt": "q", "id": "r"})
    wrong.reset()
    wrong.step("wrong")
    assert wrong.step("wrong") == ([], None, True)
    right = cls({"prompt": "q", "id": "r"})
    right.reset()
    right.step("wrong")
    assert right.step("right") == ([], 1.0, True)


class _ReadsExtras(BaseTextEnv):
    def __init__(self, env_config=None, extras={}):
        super().__init__()
        self.answer = extras["reward_spec"]["ground_truth"]


def test_an_env_reading_an_extra_its_row_lacks_is_the_rows_fault():
    from streamrl.tasks.data_errors import WatchedRow, data_error

    skyrl_gym.register(id="streamrl-test-reads-extras", entry_point=_ReadsExtras)
    cls = environment_class(_task("streamrl-test-reads-extras"))
    row = WatchedRow({"prompt": "q", "id": "r"}, "data.jsonl:3")
    with pytest.raises(KeyError) as got:
        cls(row)
    assert data_error(row, got.value) == "missing column 'reward_spec'"
    assert data_error(WatchedRow({"prompt": "q"}, "x"), KeyError("reward_spec")) is None  # not read from the row


def test_a_rows_env_class_overrides_the_configured_env():
    cls = environment_class(_task(f"{EXAMPLE / 'copy_env.py'}:CopyEnv"))
    env = cls({"prompt": "q", "id": "r", "env_class": "gsm8k", "reward_spec": {"ground_truth": "7"}})
    env.reset()
    assert env.step("#### 7") == ([], 1.0, True)


def test_an_unknown_env_id_or_a_class_that_is_no_env_is_refused_at_the_start(tmp_path):
    with pytest.raises(ValueError, match="no SkyRL-Gym env by that id.*registered:.*gsm8k"):
        environment_class(_task("no-such-env"))
    (tmp_path / "notenv.py").write_text("class NotEnv:\n    pass\n")
    with pytest.raises(ValueError, match="not a skyrl_gym.Env"):
        environment_class(_task(f"{tmp_path / 'notenv.py'}:NotEnv"))


def test_the_skyrl_gym_task_is_episodic_and_its_environment_class_is_the_adapter():
    from streamrl.tasks.skyrl_adapter import SkyRLGymTask

    assert config.rollout_kind(_task("gsm8k")) == "environment_episodes"
    task = SkyRLGymTask.__new__(SkyRLGymTask)  # the rows are not needed to name the class
    task.cfg = _task("gsm8k")
    assert config.rollout_kind(task.cfg) == "environment_episodes"
    assert environments.class_of(task, task.cfg).__name__ == "SkyRLGym[gsm8k]"


def test_an_id_registered_by_the_users_module_is_made_after_importing_it(tmp_path):
    (tmp_path / "my_envs.py").write_text(
        "import skyrl_gym\n"
        "from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput\n"
        "class Echo(BaseTextEnv):\n"
        "    def __init__(self, env_config=None, extras={}):\n"
        "        super().__init__()\n"
        "    def step(self, action):\n"
        "        return BaseTextEnvStepOutput(observations=[], reward=float(action == 'yes'), done=True, metadata={})\n"
        "skyrl_gym.register(id='streamrl-test-echo', entry_point=Echo)\n")
    cls = environment_class(_task(f"{tmp_path / 'my_envs.py'}:streamrl-test-echo"))
    env = cls({"prompt": "say yes", "id": "r"})
    env.reset()
    assert env.step("yes") == ([], 1.0, True) and type(env.env).__name__ == "Echo"
    with pytest.raises(ValueError, match="nor is 'no-such-id' a registered SkyRL-Gym env id"):
        environment_class(_task(f"{tmp_path / 'my_envs.py'}:no-such-id"))


class _Configured(BaseTextEnv):
    def __init__(self, env_config=None, extras={}):
        super().__init__()
        self.bonus = env_config.bonus  # attribute access, as on the DictConfig SkyRL hands an env

    def step(self, action: str) -> BaseTextEnvStepOutput:
        return BaseTextEnvStepOutput(observations=[], reward=self.bonus, done=True, metadata={})


def test_task_env_config_reaches_the_env_as_skyrl_hands_it():
    skyrl_gym.register(id="streamrl-test-configured", entry_point=_Configured)
    cls = environment_class(_task("streamrl-test-configured", env_config={"bonus": 1.0}))
    env = cls({"prompt": "q", "id": "r"})
    env.reset()
    assert env.step("anything") == ([], 1.0, True)
