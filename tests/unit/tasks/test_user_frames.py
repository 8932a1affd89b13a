"""A user's failure is shown from the user's own frame (streamrl.tasks.user_frames, docs/guides/faults-and-security.md
"Your own frames"): streamrl's frames and those of the pool, thread or event loop that ran the code are left out, the
frames the user's code calls into are kept. The paths that show one: a reward function (here), an environment, a
tool and a SkyRL-Gym env (tests/unit/actors/test_episodes.py), an agent (test_agents.py), a verifiers environment
(test_verifiers_env.py)."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest

from streamrl.tasks.reward_functions import Call, RewardFunctions
from streamrl.tasks.reward_health import UserCodeFailure
from streamrl.tasks.user_frames import user_traceback

USER = '''
def fails(x):
    return {}["missing"]


def calls_back(helper):
    return helper()
'''
# A stand-in for a streamrl module that runs the user's code on a pool and catches what it raises, as the actor does
# (its frames carry streamrl's module name).
RUNNER = '''
import concurrent.futures as cf

def run(fn, *args):
    with cf.ThreadPoolExecutor(1) as pool:
        try:
            pool.submit(fn, *args).result()
        except Exception as e:
            return e

def check():
    raise ValueError("what the user returned is on no level")

def checked():
    try:
        check()
    except Exception as e:
        return e
'''


def first_frame(tb: str) -> str:
    """The file of a formatted traceback's first frame."""
    return re.search(r'File "([^"]+)"', tb)[1]


@pytest.fixture
def user(tmp_path):
    path = tmp_path / "user_code.py"
    path.write_text(USER)
    spec = importlib.util.spec_from_file_location("user_code", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def runner():
    module = type(sys)("streamrl.fake_runner")
    exec(compile(RUNNER, "<streamrl runner>", "exec"), module.__dict__)
    return module


def test_a_traceback_starts_at_the_users_frame_past_streamrls_and_the_pools(user, runner):
    tb = user_traceback(runner.run(user.fails, 1))
    assert first_frame(tb) == user.__file__, tb
    assert "streamrl runner" not in tb and "concurrent" not in tb and tb.endswith("KeyError: 'missing'\n"), tb


def test_the_frames_the_users_code_calls_into_are_kept(user, runner):
    tb = user_traceback(runner.run(user.calls_back, runner.check))
    assert first_frame(tb) == user.__file__ and "in check" in tb, tb  # the user's frame, then what it called


def test_a_failure_with_no_frame_of_the_users_keeps_its_whole_traceback(runner):
    tb = user_traceback(runner.checked())
    assert "in checked" in tb and "in check" in tb, tb


def test_a_reward_functions_traceback_starts_at_its_own_frame(tmp_path):
    path = tmp_path / "rewards_of_mine.py"
    path.write_text("def needs_target(prompts, completions, **kwargs):\n    return [kwargs['target'] for _ in completions]\n")
    fns = RewardFunctions([f"{path}:needs_target"], fail_window=4, fail_threshold=0.5, workers=2)
    try:
        with pytest.raises(UserCodeFailure) as got:
            fns.score([Call("p", ["a", "b"], [[]] * 2, {}) for _ in range(3)])
    finally:
        fns.close()
    assert first_frame(got.value.traceback) == str(path), got.value.traceback
