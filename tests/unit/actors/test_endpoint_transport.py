"""The client streamrl hands an agent calls the actor's endpoint in process (`streamrl.actors.endpoint_transport`):
no HTTP request reaches the server, yet every request goes through the endpoint's ASGI app and its checks (a forged
credential gets 401, an oversize body 413, both counted); an agent that makes its own client from the one it was
given still reaches the endpoint over loopback HTTP. And the runner's batching window (`AgentEpisodes._gather`)
runs from the last request: requests that trickle in make one batch, and nothing is waited for once every running
episode has asked."""

from __future__ import annotations

import threading
import time

import pytest

from streamrl.actors import endpoint as endpoint_lib
from streamrl.actors.endpoint import Request

pytest.importorskip("openai")
from test_endpoint_attacks import _prompts, _runner  # noqa: E402  (the runner those tests build, on the same example)


def _http_requests(runner) -> int:
    """HTTP requests the endpoint's server has read off its socket."""
    return runner.endpoint.server.server_state.total_requests


TWO_TURNS = """
def agent(client, row):
    messages = [{"role": "user", "content": row["prompt"]}]
    first = client.chat.completions.create(model="policy", messages=messages, max_tokens=2)
    said = first.choices[0].message.content
    messages += [{"role": "assistant", "content": said}, {"role": "user", "content": "next"}]
    client.chat.completions.create(model="policy", messages=messages, max_tokens=2)
    return 1.0
"""


def test_the_agents_client_calls_the_endpoint_in_process_not_over_http(tmp_path):
    runner = _runner(tmp_path, TWO_TURNS)
    try:
        groups, stats, done = runner.make_groups(_prompts(2), version=0)
    finally:
        runner.close()
    assert len(groups) == 2 and stats.turns == [2] * 4 and done.reward_raised == 0
    assert _http_requests(runner) == 0


def test_the_in_process_client_goes_through_the_endpoints_checks(tmp_path, monkeypatch):
    monkeypatch.setattr(endpoint_lib, "MAX_BODY_BYTES", 4096)
    seen = tmp_path / "seen.txt"
    runner = _runner(tmp_path, f"""
import openai
def agent(client, row):
    episode = client.default_headers["X-Episode-Id"]
    got = []
    for bad, messages in ((client.with_options(api_key=episode + ":forged"), [{{"role": "user", "content": "a"}}]),
                          (client, [{{"role": "user", "content": "a " * 4000}}])):
        try:
            bad.chat.completions.create(model="policy", messages=messages, max_tokens=2)
        except openai.APIStatusError as e:
            got.append(f"{{e.status_code}}:{{e.body['code']}}")
    client.chat.completions.create(model="policy", messages=[{{"role": "user", "content": row["prompt"]}}],
                                   max_tokens=2)
    with open({str(seen)!r}, "a") as f:
        f.write(" ".join(got) + "\\n")
    return 1.0
""")
    try:
        groups, stats, done = runner.make_groups(_prompts(2), version=0)
    finally:
        runner.close()
    assert seen.read_text().splitlines() == ["401:unauthorized 413:too_large"] * 4
    assert stats.endpoint_refused == {"unauthorized": 4, "too_large": 4}
    assert len(groups) == 2 and stats.turns == [1] * 4 and done.reward_raised == 0
    assert _http_requests(runner) == 0  # refused in process, by the app's own checks


def test_an_agent_that_makes_its_own_client_from_the_given_one_reaches_the_endpoint_over_http(tmp_path):
    runner = _runner(tmp_path, """
import openai
def agent(client, row):
    messages = [{"role": "user", "content": row["prompt"]}]
    first = client.chat.completions.create(model="policy", messages=messages, max_tokens=2)
    own = openai.OpenAI(base_url=str(client.base_url), api_key=client.api_key, max_retries=0)
    said = first.choices[0].message.content
    messages += [{"role": "assistant", "content": said}, {"role": "user", "content": "next"}]
    own.chat.completions.create(model="policy", messages=messages, max_tokens=2)
    own.close()
    return 1.0
""")
    try:
        groups, stats, done = runner.make_groups(_prompts(2), version=0)
    finally:
        runner.close()
    assert len(groups) == 2 and stats.turns == [2] * 4 and done.reward_raised == 0
    assert _http_requests(runner) == 4  # each episode's second turn, and only those


class _Thinking:
    returned = False


def _trickle(runner, ids: list[str], gap_s: float) -> threading.Thread:
    def put() -> None:
        for i in ids:
            runner.endpoint.requests.put(Request("chat", {}, i))
            time.sleep(gap_s)

    thread = threading.Thread(target=put, daemon=True)
    thread.start()
    return thread


def test_requests_that_trickle_in_within_the_window_of_each_other_make_one_batch(tmp_path):
    runner = _runner(tmp_path, TWO_TURNS, "endpoint.batch_window_s=1.5")
    try:  # nine episodes asking 0.2 s apart: 1.6 s from the first to the last, each well within 1.5 s of the last
        _trickle(runner, [f"e{i}" for i in range(9)], 0.2)
        batch = runner._gather([_Thinking() for _ in range(9)])
    finally:
        runner.close()
    assert [r.episode_id for r in batch] == [f"e{i}" for i in range(9)]


def test_the_window_waits_for_nothing_once_every_running_episode_has_asked(tmp_path):
    runner = _runner(tmp_path, TWO_TURNS, "endpoint.batch_window_s=60")
    try:
        _trickle(runner, ["e0", "e1", "e2"], 0.0).join()
        t0 = time.perf_counter()
        batch = runner._gather([_Thinking() for _ in range(3)])
        waited = time.perf_counter() - t0
    finally:
        runner.close()
    assert len(batch) == 3 and waited < 30  # a window of 60 s, not waited for


def test_an_async_agent_runs_on_the_endpoints_loop_with_an_async_client_through_the_same_checks(tmp_path):
    seen = tmp_path / "seen.txt"
    runner = _runner(tmp_path, f"""
import threading
import openai
async def agent(client, row):
    episode = client.default_headers["X-Episode-Id"]
    try:
        await client.with_options(api_key=episode + ":forged").chat.completions.create(
            model="policy", messages=[{{"role": "user", "content": "a"}}], max_tokens=2)
        refused = None
    except openai.APIStatusError as e:
        refused = e.status_code
    messages = [{{"role": "user", "content": row["prompt"]}}]
    first = await client.chat.completions.create(model="policy", messages=messages, max_tokens=2)
    said = first.choices[0].message.content
    messages += [{{"role": "assistant", "content": said}}, {{"role": "user", "content": "next"}}]
    await client.chat.completions.create(model="policy", messages=messages, max_tokens=2)
    with open({str(seen)!r}, "a") as f:
        f.write(f"{{type(client).__name__}} {{threading.current_thread().name}} {{refused}}\\n")
    return 1.0
""")
    try:
        groups, stats, done = runner.make_groups(_prompts(2), version=0)
    finally:
        runner.close()
    assert seen.read_text().splitlines() == ["AsyncOpenAI actor-0-endpoint 401"] * 4  # no thread of its own
    assert len(groups) == 2 and stats.turns == [2] * 4 and done.reward_raised == 0
    assert stats.endpoint_refused == {"unauthorized": 4} and _http_requests(runner) == 0


def test_an_async_agent_past_its_timeout_is_cancelled_and_counted(tmp_path):
    seen = tmp_path / "seen.txt"
    runner = _runner(tmp_path, f"""
import asyncio
async def agent(client, row):
    await client.chat.completions.create(model="policy", messages=[{{"role": "user", "content": row["prompt"]}}])
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        with open({str(seen)!r}, "a") as f:
            f.write("cancelled\\n")
        raise
""", "task.agent_timeout_s=1")
    try:
        groups, stats, done = runner.make_groups(_prompts(1), version=0)
        deadline = time.monotonic() + 10  # the cancellation runs on the endpoint's loop
        while time.monotonic() < deadline and len(seen.read_text().split() if seen.exists() else []) < 2:
            time.sleep(0.05)
    finally:
        runner.close()
    assert done.reward_timeout == 2 and stats.truncated == {"agent_timeout": 2}
    assert seen.read_text().split() == ["cancelled"] * 2  # stopped, not left running as a thread would be
