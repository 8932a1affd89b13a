"""Agent episodes through the whole loop (docs/guides/agents.md): two actors run examples/copy-agent's agent, plain
`openai` client code, against their own endpoints; the episodes stream to the DeepSpeed learner and train. A
failing agent is counted in summary.json. The learning proof (chance towards ≥ 0.6 reward) takes a few hundred
steps: opt-in, `STREAMRL_AGENT_LEARNING=1 pytest -q tests/integration/test_agents_run.py` (in .ci/run)."""

from __future__ import annotations

import json
import os
import time

import pytest
from procs import FREE_PORTS, REPO, metrics, streamrl, summary

pytestmark = pytest.mark.slow
pytest.importorskip("openai")
EXAMPLE = REPO / "examples" / "copy-agent"
QUIET = [*FREE_PORTS, "monitoring.learner_port=0", "monitoring.actor_port=0"]


def _args(tmp_path, *more: str) -> list[str]:
    return [str(EXAMPLE / "config.yaml"), f"task.data={EXAMPLE / 'train.jsonl'}",
            f"task.agent={EXAMPLE / 'agent.py'}:copy_agent", f"run_dir={tmp_path / 'runs'}", *QUIET, *more]


@pytest.mark.long
def test_agent_episodes_train_through_the_loop_on_the_tokens_the_endpoints_sampled(tmp_path):
    streamrl("run", *_args(tmp_path, "steps=6", "endpoint.record_turns=true"), cwd=tmp_path, timeout=400)
    run = tmp_path / "runs" / "copy-agent"
    s = summary(run)
    assert s["status"] == "finished" and s["groups_used"] == 6 * 16, s
    assert not s.get("reward_failures"), s
    for i in range(2):
        turns = [json.loads(x) for x in (run / "agent_turns" / f"actor-{i}.jsonl").read_text().splitlines()]
        by_episode: dict[str, list] = {}
        for t in turns:
            by_episode.setdefault(t["episode"], []).append(t)
        assert by_episode and all(len(ts) == 2 for ts in by_episode.values())  # the agent's two model calls
        for first, second in by_episode.values():
            # token in, token out: turn 2 was given turn 1's prompt and sampled ids unchanged, then the environment's
            assert second["prompt_ids"][:len(first["prompt_ids"]) + len(first["completion_ids"])] == \
                first["prompt_ids"] + first["completion_ids"]
            assert len(first["completion_ids"]) == len(first["logprobs"]) and all(p <= 0 for p in first["logprobs"])
            assert first["version"] == second["version"] <= 6
    # the samples log (step 0's, log.samples_every) holds each episode turn by turn: the model's, "next", the model's
    logged = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert logged and all([(t["role"], t["text"]) for t in r["conversation"]][1] == ("environment", "next")
                          and [t["role"] for t in r["conversation"]] == ["model", "environment", "model"]
                          and r["turns"] == 2 and r["tool_calls"] == {} for r in logged), logged[:2]
    shown = streamrl("samples", str(run), "--limit", "1", cwd=tmp_path).stdout
    assert "2 model turns, 1 environment turn, 0 tool turns; tool calls: none" in shown and "      environment  next" \
        in shown and shown.count("    ▶ model ") == 2, shown


@pytest.mark.long
def test_an_agent_that_raises_is_counted_in_the_summary(tmp_path):
    (tmp_path / "flaky.py").write_text(
        "import random\n"
        "def agent(client, row):\n"
        "    r = client.chat.completions.create(model='policy', messages=[{'role': 'user', 'content': row['prompt']}])\n"
        "    if random.random() < 0.2:  # a minority: counted, the run goes on\n"
        "        raise RuntimeError('flaky agent')\n"
        "    return 0.5\n")
    streamrl("run", *_args(tmp_path, "steps=3", f"task.agent={tmp_path / 'flaky.py'}:agent"), cwd=tmp_path,
             timeout=400)
    s = summary(tmp_path / "runs" / "copy-agent")
    assert s["status"] == "finished", s
    assert s["reward_failures"].get("raised", 0) > 0, s


STREAMING_AGENT = '''
from pathlib import Path

TOOLS = [{"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {
    "x": {"type": "string"}}}}}]


def agent(client, row):
    """Streams its first turn (a tool declared), asks for two choices of its second, goes on with the second."""
    messages = [{"role": "user", "content": row["prompt"]}]
    chunks = list(client.chat.completions.create(model="policy", messages=messages, max_tokens=2, stream=True,
                                                 tools=TOOLS))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    last = chunks[-1].choices[0]
    assert last.finish_reason in ("stop", "length", "tool_calls")
    assert last.token_ids and bool(calls) == (last.finish_reason == "tool_calls"), chunks
    if calls:  # the model wrote `a <x>`: the tool's result goes back as a tool message
        assert calls[0].function.name == "a" and not text, chunks
        with open(Path(__file__).with_suffix(".calls"), "a") as f:
            f.write(calls[0].function.arguments + "\\n")
        call = {"id": calls[0].id, "type": "function", "function": {"name": "a",
                                                                    "arguments": calls[0].function.arguments}}
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": calls[0].id, "content": "b"}]
    else:
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    r = client.chat.completions.create(model="policy", messages=messages, max_tokens=2, n=2)
    held = chunks[-1].prompt_token_ids + last.token_ids  # token in, token out: the streamed ids, unchanged
    assert len(r.choices) == 2 and r.prompt_token_ids[:len(held)] == held, (held, r.prompt_token_ids)
    said = (text.split() + (r.choices[1].message.content or "").split())[:4]  # None: it called the tool
    return sum(a == b for a, b in zip(said, row["target"].split())) / 4
'''


@pytest.mark.long
def test_streamed_n_choice_and_tool_call_turns_train_through_the_loop(tmp_path):
    (tmp_path / "streaming.py").write_text(STREAMING_AGENT)
    streamrl("run", *_args(tmp_path, "steps=3", "task.agent=streaming.py:agent", "endpoint.record_turns=true"),
             cwd=tmp_path, timeout=400)
    run = tmp_path / "runs" / "copy-agent"
    s = summary(run)
    assert s["status"] == "finished" and s["groups_used"] == 3 * 16 and not s.get("reward_failures"), s
    turns = [json.loads(x) for x in (run / "agent_turns" / "actor-0.jsonl").read_text().splitlines()]
    assert turns and sorted({t["choice"] for t in turns if t["turn"] == 1}) == [0, 1]
    assert all(t["choice"] == 0 for t in turns if t["turn"] == 0)
    assert (tmp_path / "streaming.calls").read_text().strip()  # some replies called the tool (~1 in 10)


BROKEN_AGENTS = '''
import time

def raises(client, row):
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
    return {}["no_such_key"]

def hangs(client, row):
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
    time.sleep(30)
    return 1.0

def never_asks(client, row):
    return 1.0

def reads_missing(client, row):
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
    return row["no_such_column"]
'''


@pytest.mark.long
@pytest.mark.parametrize("agent,reason,shown", [("raises", "raised", "KeyError: 'no_such_key'"),
                                                ("hangs", "timeout", "task.agent_timeout_s=1s"),
                                                ("never_asks", "no_model_call", "without calling the model"),
                                                ("reads_missing", "bad_data", "missing column 'no_such_column'")])
def test_an_agent_failing_on_most_episodes_stops_the_run_naming_it_and_its_error(tmp_path, agent, reason, shown):
    """A row lacking what the agent reads stops the run too, naming the data and the row's line, not the agent."""
    (tmp_path / "broken.py").write_text(BROKEN_AGENTS)
    t0 = time.monotonic()
    out = streamrl("run", *_args(tmp_path, "steps=300", f"task.agent=broken.py:{agent}", "task.agent_timeout_s=1",
                                 "task.reward_fail_window=16"), cwd=tmp_path, timeout=200, check=False)
    terminal = out.stdout + out.stderr
    assert out.returncode == 1, (out.returncode, terminal[-3000:])
    assert time.monotonic() - t0 < 150  # not learner.data_timeout_s: the actor says why at once
    who = "data " if reason == "bad_data" else f"agent broken.py:{agent} "
    assert f"{who}" in terminal and "failed on" in terminal and shown in terminal, terminal[-3000:]
    if agent == "raises":  # the agent's own frame, with the line that raised
        assert 'broken.py", line 6, in raises' in terminal, terminal[-3000:]
    s = summary(tmp_path / "runs" / "copy-agent")
    assert s["status"] == "failed" and s["user_code_failure"]["reason"] == reason, s
    kind = "data" if reason == "bad_data" else "agent"
    assert s["user_code_failure"]["kind"] == kind and sum(s["user_code_failure"]["counts"].values()) > 8, s
    if reason == "bad_data":  # the row named by its file and line
        assert "train.jsonl:" in terminal and "missing column 'no_such_column'" in terminal, terminal[-3000:]


@pytest.mark.agent_learning
@pytest.mark.skipif(not os.environ.get("STREAMRL_AGENT_LEARNING"), reason="opt-in: STREAMRL_AGENT_LEARNING=1")
@pytest.mark.timeout(900)
def test_the_copy_agent_learns_from_chance_towards_0_6(tmp_path):
    streamrl("run", *_args(tmp_path, "steps=500"), cwd=tmp_path, timeout=840)  # the example's lr, 5e-4
    records = metrics(tmp_path / "runs" / "copy-agent")
    first, last = records[:50], records[-50:]
    start = sum(r["reward_mean"] for r in first) / len(first)
    end = sum(r["reward_mean"] for r in last) / len(last)
    print(f"copy agent: reward {start:.3f} (first 10%) -> {end:.3f} (last 10%)")
    assert start < 0.25 and end >= 0.6, (start, end)
