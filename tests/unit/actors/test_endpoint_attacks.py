"""The actor's endpoint against clients that are not its agents (issue 47): bounded loopback clients, inside the
tests, that name live episodes without their credential, flood, send bodies whose length lies, never finish their
requests, nest JSON 100,000 deep or leave before their answer. The real agents' episodes go on untouched, every
refusal is OpenAI-shaped and counted, and the process neither grows nor holds threads nor logs tracebacks."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from streamrl import config
from streamrl.actors import backends
from streamrl.actors.agents import AgentEpisodes
from streamrl.models import model as model_lib
from streamrl.tasks import rewards
from streamrl.tasks.base import Prompt

pytest.importorskip("openai")
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "copy-agent"


def _runner(tmp_path, agent_body: str, *overrides) -> AgentEpisodes:
    path = tmp_path / "agents.py"
    path.write_text(agent_body)
    cfg = config.load(str(EXAMPLE / "config.yaml"), [
        f"task.data={EXAMPLE / 'train.jsonl'}", f"task.agent={path}:agent", "actors.group_size=2",
        f"run_dir={tmp_path}", *overrides])
    reward = rewards.build(cfg)
    model, tok = model_lib.build(cfg, reward.task.vocabulary)
    backend = backends.build("hf", cfg, model, tok)
    return AgentEpisodes(cfg, 0, backend, tok, reward, "actor-0", backend.eos_ids)


def _prompts(k: int) -> list[Prompt]:
    return [Prompt(id=f"p{i}", text="copy : a b c d =", columns={"target": "a b c d"}) for i in range(k)]


def _address(runner) -> tuple[str, int]:
    host, port = runner.endpoint.url.removeprefix("http://").removesuffix("/v1").rsplit(":", 1)
    return host, int(port)


def _exchange(address, raw: bytes, timeout: float = 20.0) -> tuple[int, dict | None]:
    """Sends `raw` on a fresh connection and reads one answer: (status, its JSON body), or (0, None) if the server
    closed the connection without one."""
    with socket.create_connection(address, timeout=timeout) as s:
        s.sendall(raw)
        return _answer(s)


def _answer(s: socket.socket) -> tuple[int, dict | None]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return 0, None
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += s.recv(65536)
    return int(head.split()[1]), json.loads(body)


def _post(path: str, body: bytes, headers: dict[str, str]) -> bytes:
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def _openai_error(body, code: str) -> bool:
    error = body["error"] if isinstance(body, dict) else {}
    return error.get("code") == code and bool(error.get("type")) and bool(error.get("message"))


FOREIGN = """
import json, socket
def foreign(client, headers, body):
    host, port = str(client.base_url).removeprefix("http://").rstrip("/").removesuffix("/v1").rsplit(":", 1)
    data = json.dumps(body).encode()
    extra = "".join(f"{k}: {v}\\r\\n" for k, v in headers.items())
    with socket.create_connection((host, int(port)), timeout=20) as s:
        head = f"POST /v1/chat/completions HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: {len(data)}\\r\\n{extra}\\r\\n"
        s.sendall(head.encode() + data)
        return int(s.recv(65536).split()[1])
"""


def test_a_foreign_request_naming_a_live_episode_gets_401_and_the_real_agent_still_succeeds(tmp_path):
    seen = tmp_path / "seen.jsonl"
    runner = _runner(tmp_path, FOREIGN + f"""
def agent(client, row):
    messages = [{{"role": "user", "content": row["prompt"]}}]
    r = client.chat.completions.create(model="policy", messages=messages, max_tokens=2)
    episode = client.default_headers["X-Episode-Id"]
    injected = messages + [{{"role": "assistant", "content": "z"}}, {{"role": "user", "content": "next"}}]
    got = [foreign(client, {{"X-Episode-Id": episode, "Authorization": "Bearer streamrl"}}, {{"messages": injected}}),
           foreign(client, {{}}, {{"messages": injected, "user": episode}}),
           foreign(client, {{"Authorization": "Bearer " + episode + ":AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}},
                   {{"messages": injected}})]
    messages += [{{"role": "assistant", "content": r.choices[0].message.content}},
                 {{"role": "user", "content": "next"}}]
    client.chat.completions.create(model="policy", messages=messages, max_tokens=2)  # its own turn goes on
    with open({str(seen)!r}, "a") as f:
        f.write(json.dumps({{"episode": episode, "foreign": got}}) + "\\n")
    return 1.0
""")
    try:
        groups, stats, done = runner.make_groups(_prompts(2), version=0)
    finally:
        runner.close()
    lines = [json.loads(line) for line in seen.read_text().splitlines()]
    assert [line["foreign"] for line in lines] == [[401, 401, 401]] * 4
    assert done.reward_raised == 0 and len(groups) == 2 and all(g.rewards == [1.0, 1.0] for g in groups)
    assert stats.turns == [2] * 4  # no injected turn became part of an episode
    assert stats.endpoint_refused == {"unauthorized": 12}
    # ids nobody outside can list: a random part, not a call counter
    parts = [line["episode"].split("-") for line in lines]
    assert all(len(p[2]) == 12 and p[:2] == ["actor", "0"] for p in parts) and len({p[2] for p in parts}) == 1


def test_many_injected_requests_neither_stop_the_run_nor_touch_the_failure_window(tmp_path):
    runner = _runner(tmp_path, FOREIGN + """
def agent(client, row):
    episode = client.default_headers["X-Episode-Id"]
    siblings = [episode.rsplit("-", 1)[0] + f"-{i}" for i in range(2)]
    messages = [{"role": "user", "content": row["prompt"]}]
    codes = [foreign(client, {"X-Episode-Id": siblings[k % 2]}, {"messages": messages}) for k in range(40)]
    assert set(codes) == {401}, codes
    client.chat.completions.create(model="policy", messages=messages, max_tokens=2)
    return 1.0
""", "task.reward_fail_window=4", "task.reward_fail_threshold=0.5")
    try:
        groups, stats, done = runner.make_groups(_prompts(4), version=0)  # 320 injected requests
    finally:
        runner.close()
    assert len(groups) == 4 and done.reward_raised == done.reward_timeout == 0 and not runner.failures
    assert runner.health.first == {}  # nothing failed: the window saw four ok episodes
    assert stats.endpoint_refused == {"unauthorized": 320} == dict(runner.endpoint.refused_total)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def test_a_lying_content_length_or_an_oversize_chunked_body_gets_4xx_and_the_process_does_not_grow(tmp_path):
    runner = _runner(tmp_path, "def agent(client, row):\n    return 0.0\n")
    address = _address(runner)
    try:
        before = _rss_mb()
        for length in ("-1", "abc", "1e3", ""):
            raw = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n"
                   + "x" * 64).encode()
            status, body = _exchange(address, raw)
            assert status == 400 and _openai_error(body, "bad_http"), (length, status, body)
        status, body = _exchange(address, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                          b"Content-Length: 629145600\r\n\r\n")  # 600 MiB announced, none sent
        assert status == 413 and _openai_error(body, "too_large")
        with socket.create_connection(address, timeout=20) as s:  # 128 MiB in 1 MiB chunks, never a length
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b"%x\r\n" % (1 << 20) + b"[" * (1 << 20) + b"\r\n"
            try:
                for _ in range(128):
                    s.sendall(chunk)
                s.sendall(b"0\r\n\r\n")
            except OSError:
                pass  # cut off once answered: what matters is the answer
            status, body = _answer(s)
        assert status == 413 and _openai_error(body, "too_large")
        assert _rss_mb() - before < 64, (before, _rss_mb())
        assert runner.endpoint.refused_total == {"bad_http": 4, "too_large": 2}
    finally:
        runner.close()


def test_half_sent_requests_time_out_and_hold_no_threads(tmp_path):
    runner = _runner(tmp_path, "def agent(client, row):\n    return 0.0\n", "endpoint.read_timeout_s=1")
    address = _address(runner)
    threads = threading.active_count()
    socks = []
    try:
        for k in range(300):
            s = socket.create_connection(address, timeout=20)
            if k % 3 == 0:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-")  # headers cut short
            elif k % 3 == 1:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"messa")
            socks.append(s)  # k % 3 == 2: nothing at all
        assert threading.active_count() <= threads + 2  # connections hold no thread
        t0 = time.perf_counter()
        outcomes = [_answer(s)[0] for s in socks]  # each waits at most read_timeout_s (and the machine's load)
        assert time.perf_counter() - t0 < 15
        assert outcomes == [408, 408, 0] * 100, sorted(set(outcomes))
        status, body = _exchange(address, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 200 and body["data"][0]["id"] == "policy"  # still serving
        time.sleep(0.5)
        assert not runner.endpoint.server.server_state.connections  # none left open
        assert runner.endpoint.refused_total == {"read_timeout": 300}
    finally:
        for s in socks:
            s.close()
        runner.close()


def test_json_nested_100000_deep_gets_400(tmp_path):
    runner = _runner(tmp_path, "def agent(client, row):\n    return 0.0\n")
    try:
        for deep in (b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 100_000 + b"1" + b"}" * 100_000):
            status, body = _exchange(_address(runner), _post("/v1/chat/completions", deep, {}))
            assert status == 400 and _openai_error(body, "bad_request"), body
            assert "nested too deeply" in body["error"]["message"]
    finally:
        runner.close()


def test_a_client_that_disconnects_leaves_no_traceback_in_the_log(tmp_path, caplog, capfd):
    runner = _runner(tmp_path, "def agent(client, row):\n    return 0.0\n")
    address = _address(runner)
    credential = runner.endpoint.keys.issue("actor-0-nobody-0-0")  # genuine, for an episode no runner serves
    body = json.dumps({"messages": [{"role": "user", "content": "a"}]}).encode()
    caplog.set_level("DEBUG")
    try:
        for raw in (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le",  # mid-headers
                    _post("/v1/chat/completions", body, {})[:-5],  # mid-body
                    _post("/v1/chat/completions", body, {"Authorization": f"Bearer {credential}"})):  # waiting
            s = socket.create_connection(address, timeout=20)
            s.sendall(raw)
            time.sleep(0.3)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # leaves with a reset
            s.close()
    finally:
        runner.close()  # answers the waiting request (503: stopping) to a client that is gone
    out, err = capfd.readouterr()
    assert "Traceback" not in caplog.text + out + err and "Error" not in caplog.text + err, caplog.text + err


def test_a_timed_out_agent_is_reported_as_a_timeout(tmp_path, caplog):
    """The engine is slower than the agent's patience (task.agent_timeout_s, its client's timeout): the agent's
    model call raises openai's APITimeoutError, which is a timeout, not the agent's own bug."""
    runner = _runner(tmp_path, """
def agent(client, row):
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
    return 1.0
""", "task.agent_timeout_s=1.5")
    generate = runner.backend.generate

    def slow(*args, **kwargs):  # the real engine, behind a queue of other work
        time.sleep(3)
        return generate(*args, **kwargs)

    runner.backend.generate = slow
    try:
        groups, stats, done = runner.make_groups(_prompts(2), version=0)
    finally:
        runner.close()
    assert (done.reward_timeout, done.reward_raised) == (4, 0)
    assert runner.health.first[runner.name][0] == "timeout"
    # the first batch's calls were sent before the engine stalled: their agents raised APITimeoutError at 1.5 s
    assert "timed out in episode" in caplog.text and "APITimeoutError" in caplog.text


def test_requests_past_the_in_flight_bound_get_503_and_are_counted(tmp_path, monkeypatch):
    from streamrl.actors import endpoint

    monkeypatch.setattr(endpoint, "MAX_IN_FLIGHT", 4)
    runner = _runner(tmp_path, "def agent(client, row):\n    return 0.0\n")
    address = _address(runner)
    body = json.dumps({"messages": [{"role": "user", "content": "a"}]}).encode()
    waiting = []
    try:
        for k in range(4):  # genuine, for episodes no runner serves: they wait in flight
            s = socket.create_connection(address, timeout=20)
            key = runner.endpoint.keys.issue(f"e-{k}")
            s.sendall(_post("/v1/chat/completions", body, {"Authorization": f"Bearer {key}"}))
            waiting.append(s)
        time.sleep(0.5)
        status, answer = _exchange(address, _post("/v1/chat/completions", body, {}))
        assert status == 503 and _openai_error(answer, "busy")
        assert runner.endpoint.refused_total == {"busy": 1}
    finally:
        runner.close()
    assert [_answer(s)[0] for s in waiting] == [503] * 4  # told the actor is stopping
    for s in waiting:
        s.close()
