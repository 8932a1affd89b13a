"""Agent episodes (task.name: agent) on the tiny model: the user's agent drives them through the real `openai`
client against the actor's endpoint on loopback; the ids a group carries are exactly those the endpoint
returned, turn by turn, the environment's masked; failures are counted by reason."""

from __future__ import annotations

import inspect
import json
import random
import re
import time
from pathlib import Path

import numpy as np
import pytest

from streamrl import config
from streamrl.actors import backends
from streamrl.actors.agents import AgentEpisodes
from streamrl.comm import codec
from streamrl.models import model as model_lib
from streamrl.tasks import rewards

pytest.importorskip("openai")
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "copy-agent"


def _setup(tmp_path, agent: str, *overrides):
    cfg = config.load(str(EXAMPLE / "config.yaml"), [
        f"task.data={EXAMPLE / 'train.jsonl'}", f"task.agent={agent}", "actors.group_size=2",
        f"run_dir={tmp_path}", *overrides])
    reward = rewards.build(cfg)
    model, tok = model_lib.build(cfg, reward.task.vocabulary)
    backend = backends.build("hf", cfg, model, tok)
    runner = AgentEpisodes(cfg, 0, backend, tok, reward, "actor-0", backend.eos_ids)
    return cfg, reward, tok, runner


def _prompts(reward, k):
    rng = random.Random(0)
    return [reward.task.sample(rng) for _ in range(k)]


def _agents(tmp_path, body: str) -> str:
    path = tmp_path / "agents.py"
    path.write_text(body)
    return str(path)


def test_the_ids_trained_on_are_the_ids_the_endpoint_returned_turn_by_turn(tmp_path):
    seen = tmp_path / "seen.jsonl"
    ref = _agents(tmp_path, f"""
import json, threading
lock = threading.Lock()
def agent(client, row):
    messages = [{{"role": "user", "content": row["prompt"]}}]
    got = []
    for say in ("next", None):
        r = client.chat.completions.create(model="policy", messages=messages, max_tokens=2, logprobs=True,
                                           extra_body={{"return_tokens_as_token_ids": True}})
        c = r.choices[0]
        got.append({{"id": r.id, "ids": c.token_ids, "prompt_ids": r.prompt_token_ids,
                     "logprobs": [t.logprob for t in c.logprobs.content],
                     "names": [t.token for t in c.logprobs.content], "version": r.policy_version}})
        if say:
            messages += [{{"role": "assistant", "content": c.message.content}}, {{"role": "user", "content": say}}]
    with lock, open({str(seen)!r}, "a") as f:
        f.write(json.dumps(got) + "\\n")
    return 0.5
""")
    cfg, reward, tok, runner = _setup(tmp_path, f"{ref}:agent", "endpoint.record_turns=true")
    try:
        groups, stats, done = runner.make_groups(_prompts(reward, 3), version=7)
    finally:
        runner.close()
    assert len(groups) == 3 and stats.episodes == 6 and stats.turns == [2] * 6
    returned = [json.loads(line) for line in seen.read_text().splitlines()]
    assert len(returned) == 6
    by_episode = {turns[0]["id"].rsplit("-", 1)[0]: turns for turns in returned}
    # what the learner receives: the groups through the real wire (msgspec header, raw frames)
    frames = [bytes(memoryview(f)) for f in codec.encode_groups(groups)]  # as ZeroMQ hands them over
    groups = codec.decode_groups(frames, vocab_size=len(tok))
    samples = [(g, list(g.prompt_tokens) + g.sample_tokens(i).tolist(), g.sample_model_mask(i),
                g.sample_logprobs(i)) for g in groups for i in range(g.group_size)]
    assert all(g.policy_version == 7 for g in groups)
    unmatched = list(by_episode.values())
    for g, ids, mask, lps in samples:
        # the sequence is exactly: turn-1 prompt, turn-1 ids, the environment's ids, turn-2 ids
        first, second = next(t for t in unmatched if t[1]["prompt_ids"] + t[1]["ids"] == ids)
        unmatched.remove([first, second])
        assert second["prompt_ids"][:len(first["prompt_ids"]) + len(first["ids"])] == first["prompt_ids"] + first["ids"]
        start = len(ids) - len(mask)
        assert [ids[start + k] for k in range(len(mask)) if mask[k]] == first["ids"] + second["ids"]
        assert np.allclose(lps[mask], first["logprobs"] + second["logprobs"])
        assert (lps[~mask] == 0).all() and (~mask).sum() > 0  # "next" and the turn markers: the environment's
        assert first["names"] == [f"token_id:{t}" for t in first["ids"]]
        assert first["version"] == second["version"] == 7
    assert not unmatched  # every episode the endpoint answered is one sample trained on
    recorded = [json.loads(line) for line in (tmp_path / "copy-agent" / "agent_turns" / "actor-0.jsonl").read_text().splitlines()]
    assert sorted(t["completion_ids"] for t in recorded) == sorted(t["ids"] for ts in returned for t in ts)
    assert all(g.rewards == [0.5, 0.5] for g in groups)
    assert done.reward_raised == done.reward_no_model_call == 0


def test_completions_extend_the_held_ids_and_a_rewritten_prompt_is_refused(tmp_path):
    ref = _agents(tmp_path, """
import openai
def agent(client, row):
    r = client.completions.create(model="policy", prompt=row["prompt"], max_tokens=2, logprobs=1)
    ids = r.prompt_token_ids + r.choices[0].token_ids
    r2 = client.completions.create(model="policy", prompt=ids + ids[-1:], max_tokens=2)
    assert r2.prompt_token_ids == ids + ids[-1:]
    try:
        client.completions.create(model="policy", prompt="copy : d d d d =", max_tokens=2)
    except openai.BadRequestError as e:
        assert "does not start with" in str(e)
    else:
        raise AssertionError("a prompt that rewrites the episode was served")
    return 1.0
""")
    cfg, reward, tok, runner = _setup(tmp_path, f"{ref}:agent")
    try:
        groups, stats, done = runner.make_groups(_prompts(reward, 2), version=0)
    finally:
        runner.close()
    assert done.reward_raised == 0 and len(groups) == 2 and stats.turns == [2] * 4
    for g in groups:
        assert (~g.model_token_mask).sum() == 2 * 1  # one repeated id per sample, the environment's


def test_an_agent_that_raises_hangs_or_never_calls_the_model_is_counted(tmp_path):
    ref = _agents(tmp_path, """
import time
SEEN = {}
def agent(client, row):
    kind = row["kind"]
    if kind == "silent":
        return 1.0
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
    if kind == "raise":
        raise RuntimeError("the agent's own bug")
    if kind == "hang":
        time.sleep(30)
    if kind == "bad":
        return "yes"
    if kind == "mixed" and SEEN.setdefault(row["id"], []).append(1) is None and len(SEEN[row["id"]]) == 1:
        raise RuntimeError("the first of its group")
    if kind == "none":
        return {"format": None, "copy": None}  # could not score: none
    if kind == "half":
        return {"format": None, "copy": 0.5} if row["id"] == "half" else 1.0  # a None beside a number: skipped
    return {"format": 0.25, "copy": 0.5}
""")
    cfg, reward, tok, runner = _setup(tmp_path, f"{ref}:agent", "task.agent_timeout_s=4")  # loose: a loaded machine must not time out the good ones
    from streamrl.tasks.base import Prompt

    prompts = [Prompt(id=k, text="copy : a b c d =", columns={"kind": k, "target": "a b c d"})
               for k in ("raise", "hang", "silent", "ok", "bad", "none", "half", "mixed")]
    t0 = time.perf_counter()
    try:
        groups, stats, done = runner.make_groups(prompts, version=0)
    finally:
        runner.close()
    assert time.perf_counter() - t0 < 25  # the hung agent was abandoned, not waited for
    assert (done.reward_raised, done.reward_timeout, done.reward_no_model_call, done.reward_bad_return,
            done.reward_none) == (3, 2, 2, 2, 2)
    # The silent agent's (no tokens to train on) and those whose agent failed on every episode: failed episodes are
    # unscored, never the lowest level (an agent's bug is not the model's mistake).
    assert done.groups_unscored == 5
    rewards_by_prompt = {g.prompt_id: g.rewards for g in groups}
    assert rewards_by_prompt == {"ok": [0.75] * 2, "half": [0.5] * 2, "mixed": [0.75] * 2}  # its scored one's
    assert sorted(next(g for g in groups if g.prompt_id == "mixed").scored) == [False, True]


def test_bad_requests_get_openai_shaped_errors(tmp_path):
    import openai

    ref = _agents(tmp_path, "def agent(client, row):\n    return 0.0\n")
    cfg, reward, tok, runner = _setup(tmp_path, f"{ref}:agent")
    try:
        client = openai.OpenAI(base_url=runner.endpoint.url, api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="no episode id"):
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "a"}])
        with pytest.raises(openai.BadRequestError, match="an integer from 1 to 16"):
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "a"}], n=17,
                                           user="e")
        with pytest.raises(openai.BadRequestError, match="tools: on /v1/chat/completions"):
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "a"}],
                                           tools=[{"type": "function"}], user="e")
        assert [m.id for m in client.models.list()] == ["policy"]
    finally:
        runner.close()


def test_a_streamed_turn_carries_the_text_and_ids_of_the_whole_one_and_the_episode_goes_on(tmp_path):
    seen = tmp_path / "seen.jsonl"
    ref = _agents(tmp_path, f"""
import json, threading
lock = threading.Lock()
def agent(client, row):
    messages = [{{"role": "user", "content": row["prompt"]}}]
    chunks = list(client.chat.completions.create(model="policy", messages=messages, max_tokens=2, stream=True,
                                                 stream_options={{"include_usage": True}}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    last = [c for c in chunks if c.choices][-1]
    messages += [{{"role": "assistant", "content": text}}, {{"role": "user", "content": "next"}}]
    whole = client.chat.completions.create(model="policy", messages=messages, max_tokens=2)
    with lock, open({str(seen)!r}, "a") as f:
        f.write(json.dumps({{"text": text, "finish": last.choices[0].finish_reason,
                            "ids": last.choices[0].token_ids, "prompt_ids": last.prompt_token_ids,
                            "usage": chunks[-1].usage.completion_tokens,
                            "next_prompt": whole.prompt_token_ids}}) + "\\n")
    return 0.5
""")
    cfg, reward, tok, runner = _setup(tmp_path, f"{ref}:agent")
    try:
        groups, stats, done = runner.make_groups(_prompts(reward, 2), version=0)
    finally:
        runner.close()
    assert done.reward_raised == 0 and len(groups) == 2 and stats.turns == [2] * 4
    for got in map(json.loads, seen.read_text().splitlines()):
        assert got["finish"] in ("stop", "length") and got["usage"] == len(got["ids"]) >= 1
        assert got["text"] == tok.decode(got["ids"], skip_special_tokens=True)
        # token in, token out: the next turn was given the streamed turn's ids unchanged
        assert got["next_prompt"][:len(got["prompt_ids"]) + len(got["ids"])] == got["prompt_ids"] + got["ids"]


def test_n_choices_are_each_a_turn_record_and_the_episode_goes_on_with_the_one_the_agent_sent_back(tmp_path):
    seen = tmp_path / "seen.jsonl"
    ref = _agents(tmp_path, f"""
import json, threading
lock = threading.Lock()
def agent(client, row):
    messages = [{{"role": "user", "content": row["prompt"]}}]
    r = client.chat.completions.create(model="policy", messages=messages, max_tokens=2, n=4)
    pick = r.choices[3]
    messages += [{{"role": "assistant", "content": pick.message.content}}, {{"role": "user", "content": "next"}}]
    r2 = client.chat.completions.create(model="policy", messages=messages, max_tokens=2)
    texts = [c.message.content for c in r.choices]
    with lock, open({str(seen)!r}, "a") as f:
        f.write(json.dumps({{"n": len(r.choices), "ids": [c.token_ids for c in r.choices],
                            "kept": texts.index(pick.message.content), "second": r2.choices[0].token_ids,
                            "next_prompt": r2.prompt_token_ids, "prompt_ids": r.prompt_token_ids}}) + "\\n")
    return 0.5
""")
    cfg, reward, tok, runner = _setup(tmp_path, f"{ref}:agent")
    try:
        groups, stats, done = runner.make_groups(_prompts(reward, 2), version=3)
        turns = runner.turns_log
    finally:
        runner.close()
    assert done.reward_raised == 0 and len(groups) == 2 and stats.turns == [2] * 4
    assert len(turns) == 4 * (4 + 1) and sorted(t.choice for t in turns if t.turn == 0) == sorted([0, 1, 2, 3] * 4)
    trained = [g.sample_tokens(i)[g.sample_model_mask(i)].tolist() for g in groups for i in range(g.group_size)]
    for got in map(json.loads, seen.read_text().splitlines()):
        assert got["n"] == 4
        kept = got["ids"][got["kept"]]  # the first choice with the text the agent sent back
        assert got["next_prompt"][:len(got["prompt_ids"]) + len(kept)] == got["prompt_ids"] + kept
        assert kept + got["second"] in trained  # the sample is the choice it went on with, then its next turn


def test_a_reply_calling_a_declared_tool_comes_back_as_openai_tool_calls(tmp_path):
    seen = tmp_path / "seen.jsonl"
    ref = _agents(tmp_path, f"""
import json, threading
lock = threading.Lock()
TOOLS = [{{"type": "function", "function": {{"name": "a", "description": "the tool the model calls by writing a",
           "parameters": {{"type": "object", "properties": {{"x": {{"type": "string"}}}}}}}}}}]
def agent(client, row):
    messages = [{{"role": "user", "content": row["prompt"]}}]
    r = client.chat.completions.create(model="policy", messages=messages, max_tokens=2, n=16, tools=TOOLS)
    out = [{{"ids": c.token_ids, "finish": c.finish_reason, "content": c.message.content,
             "calls": [(t.function.name, json.loads(t.function.arguments), t.id) for t in c.message.tool_calls or []]}}
           for c in r.choices]
    call = next((c for c in r.choices if c.message.tool_calls), None)
    if call is not None:  # the tool's result goes back as a tool message, as any openai agent sends it
        t = call.message.tool_calls[0]
        messages += [{{"role": "assistant", "content": None, "tool_calls": [t.model_dump()]}},
                     {{"role": "tool", "tool_call_id": t.id, "content": "b"}}]
        client.chat.completions.create(model="policy", messages=messages, max_tokens=2, tools=TOOLS)
    with lock, open({str(seen)!r}, "a") as f:
        f.write(json.dumps(out) + "\\n")
    return 0.5
""")
    cfg, reward, tok, runner = _setup(tmp_path, f"{ref}:agent")
    try:
        groups, stats, done = runner.make_groups(_prompts(reward, 3), version=0)
    finally:
        runner.close()
    assert done.reward_raised == 0 and len(groups) == 3
    choices = [c for line in seen.read_text().splitlines() for c in json.loads(line)]
    assert len(choices) == 6 * 16
    for c in choices:  # the tiny model has no template: the word format, `a <x>` calls tool a
        words = tok.decode(c["ids"], skip_special_tokens=True).split()
        if words and words[0] == "a":
            (name, args, _), = c["calls"]
            assert name == "a" and args == ({"x": words[1]} if len(words) > 1 else {}), c
            assert c["finish"] == "tool_calls" and c["content"] is None, c
        else:
            assert c["calls"] == [] and c["finish"] != "tool_calls", c
    assert any(c["calls"] for c in choices)  # ~1 in 10 replies starts with a: 96 choices all missing it is ~1e-4


def test_an_agents_traceback_starts_at_the_agents_own_frame(tmp_path):
    """What the run stops with (the failure window's first traceback) starts in the agent's file: not in the
    runner's thread, nor in streamrl's frames that called the agent (docs/guides/faults-and-security.md)."""
    ref = _agents(tmp_path, """
def agent(client, row):
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
    return {}["no_such_key"]  # its own bug (a key its row lacks would be bad data)
""")
    cfg, reward, tok, runner = _setup(tmp_path, f"{ref}:agent")
    try:
        runner.make_groups(_prompts(reward, 1), version=0)
    finally:
        runner.close()
    (reason, tb), = runner.health.first.values()
    assert reason == "raised" and re.search(r'File "([^"]+)"', tb)[1] == ref, tb
    assert inspect.getfile(AgentEpisodes) not in tb and tb.rstrip().endswith("KeyError: 'no_such_key'"), tb


def test_a_row_lacking_the_column_the_agent_reads_is_bad_data_not_the_models_mistake(tmp_path, caplog):
    # The agent raised KeyError on such a row and its samples trained as the lowest level (issue 48).
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "copy : a b a b =", "target": "a b a b"}\n{"prompt": "copy : b b a a ="}\n')
    cfg, reward, tok, runner = _setup(tmp_path, f"{EXAMPLE / 'agent.py'}:copy_agent", f"task.data={data}",
                                      "task.reward_fail_window=4")
    prompts = [reward.task.prompt(r) for r in reward.task.train]
    try:
        with caplog.at_level("WARNING", logger="streamrl.tasks"):
            groups, _, done = runner.make_groups(prompts, version=0)
        assert [g.prompt_id for g in groups] == [prompts[0].id]  # the bad row's group is not sent
        assert done.reward_bad_data == 2 and done.reward_raised == 0 and runner.bad_rows.counts == {
            "missing column 'target'": 2}
        assert runner.bad_rows.rows == {f"{data}:2": "missing column 'target'"}  # named by file and line
        named = [r.getMessage() for r in caplog.records if "bad data" in r.getMessage()]
        assert len(named) == 1 and f"{data}:2: missing column 'target'" in named[0], named  # once per row
        assert "raised" not in runner.failures  # never in the agent's own window
        with pytest.raises(codec_failure(), match=r"^data .*rows.jsonl failed on \d of its last 4 episodes "
                                                  r"\(bad_data\): .*rows.jsonl:2: missing column 'target'"):
            runner.make_groups([prompts[1]] * 2, version=0)  # nothing but bad rows: the run stops, naming it
    finally:
        runner.close()


def codec_failure():
    from streamrl.tasks.reward_health import UserCodeFailure

    return UserCodeFailure


def test_an_agents_turns_reach_the_samples_log_in_order_with_their_roles_and_tools(tmp_path):
    from streamrl.learner.samples import records

    ref = _agents(tmp_path, """
TOOLS = [{"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {}}}}]
def _two_turns(client, row, then, call=None):
    messages = [{"role": "user", "content": row["prompt"]}]
    r = client.chat.completions.create(model="policy", messages=messages, max_tokens=2, tools=TOOLS)
    messages += [{"role": "assistant", "content": r.choices[0].message.content,
                  **({"tool_calls": [call]} if call else {})}, *then]
    client.chat.completions.create(model="policy", messages=messages, max_tokens=2, tools=TOOLS)
    return 0.5
def user(client, row):  # the user says "next", as examples/copy-agent's does
    return _two_turns(client, row, [{"role": "user", "content": "next"}])
def tool(client, row):  # a tool's result, named only by the call it answers (as openai agents send it)
    call = {"id": "call-1", "type": "function", "function": {"name": "a", "arguments": "{}"}}
    return _two_turns(client, row, [{"role": "tool", "tool_call_id": "call-1", "content": "b"}], call)
""")
    for fn, middle, calls in (("user", ("environment", ()), {}), ("tool", ("tool", ("a",)), {"a/answered": 1})):
        cfg, reward, tok, runner = _setup(tmp_path, f"{ref}:{fn}")
        try:
            groups, _, done = runner.make_groups(_prompts(reward, 1), version=0)
        finally:
            runner.close()
        assert done.reward_raised == 0 and len(groups) == 1
        g = codec.decode_groups([bytes(memoryview(f)) for f in codec.encode_groups(groups)], vocab_size=len(tok))[0]
        for i in range(g.group_size):
            spans = g.sample_turns(i)
            assert [(t.role, t.tools) for t in spans] == [("model", ()), middle, ("model", ())], spans
            assert g.sample_model_mask(i).tolist() == [t.role == "model" for t in spans for _ in range(t.tokens)]
        decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731  (as the learner decodes)
        for record in records([g], 0, 0, cfg, decode, 8):
            assert [t["role"] for t in record["conversation"]] == ["model", middle[0], "model"]
            assert record["turns"] == 2 and record["tool_calls"] == calls
            assert record["conversation"][1]["text"] == ("next" if fn == "user" else "b")
