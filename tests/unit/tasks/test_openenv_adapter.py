"""task.name: openenv — an OpenEnv environment written in OpenEnv's style (examples/openenv-copy: Environment,
Action/Observation models, create_app, EnvClient) served by uvicorn on loopback (real HTTP and WebSocket), played
through OpenEnv's own clients by streamrl's adapter: reset with the row's columns, the reply in the Action, the
observation's text as the next turn, the steps' rewards onto the task's levels, failures raised."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("openenv.core")
pytest.importorskip("uvicorn")
from streamrl.tasks import openenv_adapter  # noqa: E402
from streamrl.tasks.adapted import BadReward  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "openenv-copy"
LEVELS = [0.0, 0.25, 0.5, 0.75, 1.0]
ROW = {"prompt": "copy : a b c d =", "id": "x", "target": "a b c d"}


def _task(**over):
    base = dict(name="openenv", environment=f"{EXAMPLE / 'client.py'}:CopyEnvClient", env_url=None,
                env_app=f"{EXAMPLE / 'server.py'}:app", env_action_field="message", env_observation_field="message",
                tool_timeout_s=20.0, reward_levels=LEVELS, reward_level_tolerance=0.01)
    return SimpleNamespace(**{**base, **over})


@pytest.fixture(scope="module")
def served():
    """The example's app on a loopback port of its own, as an actor serves task.env_app."""
    sys.path.append(str(EXAMPLE))
    from server import app

    url, server = openenv_adapter.serve(app)
    yield url
    server.should_exit = True


def test_the_typed_client_plays_an_episode_against_the_actors_own_server():
    cls = openenv_adapter.environment_class(_task())
    env = cls(ROW)
    assert env.reset() == [{"role": "user", "content": "copy : a b c d ="}]  # reset said nothing more
    assert env.step("a b") == ([{"role": "user", "content": "next"}], None, False)
    assert env.step("c a") == ([], 0.75, True)  # the reward proves reset got the row's target
    assert env.closed


def test_openenvs_generic_client_against_a_running_server_by_url(served):
    cls = openenv_adapter.environment_class(_task(environment=None, env_app=None, env_url=served))
    assert cls.client_cls.__name__ == "GenericEnvClient"
    envs = [cls(dict(ROW)) for _ in range(8)]  # sessions side by side, as an actor's episodes are
    for env in envs:
        env.reset()
    assert all(env.step("a b")[2] is False for env in envs)
    assert [env.step("c d") for env in envs] == [([], 1.0, True)] * 8


def test_the_action_class_comes_from_the_clients_type_parameters():
    sys.path.append(str(EXAMPLE))
    cls = openenv_adapter.environment_class(_task())
    assert openenv_adapter.action_class(cls.client_cls).__name__ == "CopyAction"


def test_a_missing_observation_field_is_named_with_the_fields_there_are(served):
    cls = openenv_adapter.environment_class(_task(env_observation_field="text", env_app=None, env_url=served))
    with pytest.raises(ValueError, match=r"no field 'text'.*message"):
        cls(ROW).reset()


def test_an_off_level_reward_or_an_environment_that_raises_is_raised(served):
    cls = openenv_adapter.environment_class(_task(reward_levels=[0.0, 1.0], env_app=None, env_url=served))
    env = cls(ROW)
    env.reset()
    env.step("a b")
    with pytest.raises(BadReward, match="on none of task.reward_levels"):
        env.step("c a")  # 0.75
    broken = cls({**ROW, "target": 7})  # the env's reset calls target.split(): the server reports its error
    with pytest.raises(RuntimeError, match="Server error"):
        broken.reset()
    broken.close()


def test_a_client_class_that_is_no_envclient_is_refused(tmp_path):
    (tmp_path / "c.py").write_text("class NotAClient:\n    pass\n")
    with pytest.raises(ValueError, match="not an OpenEnv EnvClient"):
        openenv_adapter.environment_class(_task(environment=f"{tmp_path / 'c.py'}:NotAClient"))


def test_a_session_whose_episode_ended_serves_the_next_episode_and_a_failed_one_is_closed(served):
    cls = openenv_adapter.environment_class(_task(reward_levels=[0.0, 1.0], env_app=None, env_url=served))
    first = cls(ROW)
    first.reset()
    first.step("a b")
    assert first.step("c d") == ([], 1.0, True)
    second = cls(ROW)
    assert second.client is first.client and second.reset()  # reset again on the kept session
    second.step("a b")
    with pytest.raises(BadReward):
        second.step("c a")  # 0.75: the episode failed, so its session is not kept
    second.close()
    assert cls.idle == [] and cls(ROW).client is not first.client


def test_an_environment_class_as_env_app_is_served_by_openenvs_own_app():
    cls = openenv_adapter.environment_class(_task(env_app=f"{EXAMPLE / 'copy_environment.py'}:CopyEnvironment"))
    assert cls.url != openenv_adapter.environment_class(_task()).url  # its own server, made by create_app
    env = cls(ROW)
    env.reset()
    env.step("a b")
    assert env.step("c d") == ([], 1.0, True)
