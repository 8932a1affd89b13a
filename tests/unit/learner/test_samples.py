"""The samples log (streamrl.learner.samples) and `streamrl samples` (streamrl.commands.samples): whole groups in
batch order, bounded, with the estimator's advantages and each group's lag; printed readably, ranked on request."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from streamrl import config
from streamrl.comm import codec
from streamrl.comm.codec import ScoredGroup
from streamrl.commands import cli, samples as samples_cli
from streamrl.learner.samples import SamplesLog, bounded, records, table

WORDS = {1: "red", 2: "blue", 3: "pink", 4: "say"}


def decode(ids):
    return " ".join(WORDS[i] for i in ids)


def group(pid: str, rewards: list[float], version: int) -> ScoredGroup:
    completions = [[1 + i % 3] for i in range(len(rewards))]
    return ScoredGroup.from_samples(prompt_id=pid, policy_version=version, actor_id="actor-0", prompt_tokens=[4, 2],
                                    completions=completions, logprobs=[[-1.0]] * len(rewards), rewards=rewards,
                                    finish_reasons=["stop"] * len(rewards))


def test_records_are_whole_groups_within_the_bound_with_corpo_advantages_and_lag():
    cfg = config.load(None, ["advantage.estimator=corpo", "advantage.r_min_correct=1.0"])
    groups = [group("a", [0.0, 1.0, 0.0, 0.0], 5), group("b", [1.0, 1.0, 1.0, 1.0], 6)]
    got = records(groups, step=7, version=7, cfg=cfg, decode=decode, limit=6)
    assert [r["prompt_id"] for r in got] == ["a"] * 4  # the second group does not fit whole: left out
    assert [r["advantage"] for r in got] == [-1.0, 0.0, -1.0, -1.0]  # CoRPO: baseline max(1.0, mean)
    assert got[0]["prompt"] == "say blue" and got[1]["completion"] == "blue" and got[0]["lag"] == 2
    assert len(records(groups, 7, 7, cfg, decode, limit=2)) == 2  # one group larger than the bound: cut to it


def test_the_log_is_written_every_samples_every_steps(tmp_path):
    cfg = config.load(None, ["log.samples_every=5", "log.samples_per_log=4"])
    log = SamplesLog(cfg, type("T", (), {"decode": staticmethod(lambda ids, **kw: decode(ids))})(), tmp_path)
    for step in range(11):
        log(step, step, [group("a", [0.0, 0.5, 1.0, 0.0], step)])
    lines = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in lines}) == [0, 5, 10] and len(lines) == 12


def test_streamrl_samples_prints_the_newest_step_and_ranks_with_best_and_worst(tmp_path, capsys):
    cfg = config.load(None, ["advantage.r_min_correct=1.0"])
    rows = records([group("a", [0.0, 1.0], 0)], 0, 0, cfg, decode, 8) + \
        records([group("b", [0.5, 0.0], 9)], 10, 10, cfg, decode, 8)
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli.main(["samples", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "step 10  group 0  b" in out and "step 0 " not in out and "prompt: say blue" in out, out
    assert "reward 0.500  A -0.500  stop" in out and "    | red" in out, out
    assert cli.main(["samples", str(tmp_path), "--best", "--limit", "1"]) == 0
    assert "reward 1.000" in capsys.readouterr().out
    assert cli.main(["samples", str(tmp_path), "--worst", "--step", "10", "--limit", "1"]) == 0
    assert "reward 0.000" in capsys.readouterr().out
    assert cli.main(["samples", str(tmp_path), "--step", "3"]) == 2
    assert "--step 3: not logged; logged steps: 0, 10" in capsys.readouterr().err
    assert cli.main(["samples", str(tmp_path / "nope")]) == 2
    assert "no samples log" in capsys.readouterr().err
    with pytest.raises(ValueError, match="empty"):
        samples_cli.choose([], None, False, False)


def test_records_hold_each_reward_functions_value_and_an_episodes_turns_and_tool_calls(capsys, tmp_path):
    cfg = config.load(None, ["advantage.r_min_correct=1.0"])
    g = ScoredGroup.from_samples(prompt_id="e", policy_version=0, actor_id="actor-0", prompt_tokens=[4, 2],
                                 completions=[[1], [2]], logprobs=[[-1.0]] * 2, rewards=[1.0, 0.5],
                                 finish_reasons=["stop"] * 2, scored=[True, False], parts=[[1.0, 0.0], [None, 0.5]],
                                 turns=[3, 1], tool_calls=[{"add/ok": 2}, {}])
    cfg = msgspec.structs.replace(cfg, task=msgspec.structs.replace(cfg.task, reward=["f.py:right", "f.py:short"]))
    got = records([g], 4, 4, cfg, decode, 8)
    assert got[0]["rewards_by_function"] == {"f.py:right": 1.0, "f.py:short": 0.0} and got[0]["scored"] is True
    assert got[1]["rewards_by_function"] == {"f.py:right": None, "f.py:short": 0.5} and got[1]["scored"] is False
    assert (got[0]["turns"], got[0]["tool_calls"], got[1]["tool_calls"]) == (3, {"add/ok": 2}, {})
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in got))
    assert cli.main(["samples", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "by function: f.py:right 1.000, f.py:short 0.000" in out and "3 turns, tool calls: add/ok ×2" in out, out
    assert "by function: f.py:right -, f.py:short 0.500" in out and "UNSCORED" in out, out
    columns, rows = table(got)
    assert columns[-1] == "details" and json.loads(rows[0][-1])["rewards_by_function"]["f.py:short"] == 0.0


def test_a_resumed_learner_cuts_the_log_back_to_the_steps_before_its_checkpoint_keeping_the_old_file(tmp_path):
    cfg = config.load(None, ["log.samples_every=5", "log.samples_per_log=4"])
    tok = type("T", (), {"decode": staticmethod(lambda ids, **kw: decode(ids))})()
    log = SamplesLog(cfg, tok, tmp_path)
    for step in range(16):
        log(step, step, [group("a", [0.0, 0.5, 1.0, 0.0], step)])
    SamplesLog(cfg, tok, tmp_path, resumed_step=10)  # steps 10 and later are redone
    lines = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in lines}) == [0, 5]
    [aside] = tmp_path.glob("samples.jsonl.before-resume-10-*")
    assert len(aside.read_text().splitlines()) == 16  # all 4 logged steps' records, untouched
    SamplesLog(cfg, tok, tmp_path, resumed_step=10)  # nothing past the checkpoint: nothing moved
    assert len(list(tmp_path.glob("samples.jsonl.before-resume-*"))) == 1


def _tokenizer(prompt_chars: int = 0):
    """decode(ids): the words, and with prompt_chars the prompt (the ids of `group`'s prompt) that long."""
    def text(ids, **kw):
        return "say " + "é" * prompt_chars if prompt_chars and ids == [4, 2] else decode(ids)

    return type("T", (), {"decode": staticmethod(text)})()


def test_a_200_kb_prompt_logged_every_step_keeps_lines_bounded_with_a_marker_and_the_full_length(tmp_path):
    cfg = config.load(None, ["log.samples_every=1", "log.samples_per_log=8"])
    log = SamplesLog(cfg, _tokenizer(prompt_chars=200_000), tmp_path)
    for step in range(5):
        log(step, step, [group("a", [0.0, 0.5, 1.0, 0.0], step), group("b", [1.0, 0.0, 0.0, 0.0], step)])
    lines = (tmp_path / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 40 and max(len(line) for line in lines) < 5000, max(len(line) for line in lines)
    r = json.loads(lines[0])
    assert r["truncated"] == {"prompt": 200_004} and len(r["prompt"]) < 4100
    assert r["prompt"].startswith("say éé") and "…[truncated, 200004 chars]…" in r["prompt"] and r["prompt"][-1] == "é"


def test_the_log_rotates_past_its_size_cap_keeping_every_part_and_streamrl_samples_reads_across_them(tmp_path, capsys):
    cfg = config.load(None, ["log.samples_every=1", "log.samples_per_log=4", "log.samples_max_mb=0.004"])
    log = SamplesLog(cfg, _tokenizer(), tmp_path)
    for step in range(20):
        log(step, step, [group("a", [0.0, 0.5, 1.0, float(step) / 20], step)])
    parts = sorted(p.name for p in tmp_path.glob("samples*.jsonl"))
    assert len(parts) >= 4 and "samples.1.jsonl" in parts and "samples.jsonl" in parts, parts
    assert all((tmp_path / p).stat().st_size <= 0.004 * (1 << 20) for p in parts)
    assert [r["step"] for r in samples_cli.load(tmp_path)] == [s for s in range(20) for _ in range(4)]  # in order
    assert samples_cli.load(tmp_path / "samples.jsonl") == samples_cli.load(tmp_path)
    assert cli.main(["samples", str(tmp_path), "--step", "0"]) == 0 and "step 0  group 0  a" in capsys.readouterr().out
    assert cli.main(["samples", str(tmp_path)]) == 0 and "step 19  group 0" in capsys.readouterr().out
    # a resume to step 10 cuts every part back, each part it cuts moved aside whole first; logging goes on after
    log = SamplesLog(cfg, _tokenizer(), tmp_path, resumed_step=10)
    assert sorted({r["step"] for r in samples_cli.load(tmp_path)}) == list(range(10))
    aside = [line for p in tmp_path.glob("samples*.before-resume-10-*") for line in p.read_text().splitlines()]
    assert {json.loads(line)["step"] for line in aside} >= set(range(10, 20))  # nothing destroyed
    for step in range(10, 14):  # the redone steps go on in the parts after the kept ones
        log(step, step, [group("b", [0.0, 0.5, 1.0, 0.0], step)])
    assert [r["step"] for r in samples_cli.load(tmp_path)] == [s for s in range(14) for _ in range(4)]


def test_past_samples_max_files_the_log_stops_and_deletes_nothing(tmp_path, caplog):
    cfg = config.load(None, ["log.samples_every=1", "log.samples_per_log=4", "log.samples_max_mb=0.004",
                             "log.samples_max_files=3"])
    log = SamplesLog(cfg, _tokenizer(), tmp_path)
    with caplog.at_level("WARNING"):
        for step in range(30):
            log(step, step, [group("a", [0.0, 0.5, 1.0, 0.0], step)])
    assert sorted(p.name for p in tmp_path.glob("samples*")) == ["samples.1.jsonl", "samples.2.jsonl", "samples.jsonl"]
    steps = [r["step"] for r in samples_cli.load(tmp_path)]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] < 29  # the first steps kept, the later not written
    assert caplog.text.count("no samples are logged from step") == 1


def test_streamrl_samples_escapes_control_characters_and_keeps_the_text_readable(tmp_path, capsys):
    cfg = config.load(None, ["advantage.r_min_correct=1.0"])
    [r] = records([group("a", [1.0], 0)], 0, 0, cfg, decode, 1)
    r.update(completion="ok \x1b[31mRED\x1b[0m\rgone\x07 \x9b2J \u202eevil\nnext line", actor="actor-\x1b]0;title\x07",
             turns=1, tool_calls={"\x1b[2Jwipe": 1})
    (tmp_path / "samples.jsonl").write_text(json.dumps(r) + "\n")
    assert cli.main(["samples", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert not any(c in out for c in "\x1b\r\x07\x9b\u202e"), repr(out)
    assert r"ok \x1b[31mRED\x1b[0m\rgone\x07 \x9b2J \u202eevil next line" in out, out
    assert r"from actor-\x1b]0;title\x07" in out and r"tool calls: \x1b[2Jwipe ×1" in out, out


WORDS.update({5: "d", 6: "c", 7: "same", 8: "a", 9: "lookup", 10: "7"})


def episode_group() -> ScoredGroup:
    """Two episodes through the real wire: `d c | same | c a` (model, environment, model) and a tool call's."""
    from streamrl.comm.turn_spans import TurnSpan

    g = ScoredGroup.from_samples(
        prompt_id="e", policy_version=0, actor_id="actor-0", prompt_tokens=[4, 2], completions=[[5, 6, 7, 6, 8],
                                                                                                  [9, 8, 10, 8]],
        logprobs=[[-1.0] * 5, [-1.0] * 4], rewards=[1.0, 0.0], finish_reasons=["stop"] * 2, turns=[2, 2],
        tool_calls=[{}, {"lookup/ok": 1}], model_token_masks=[np.array([1, 1, 0, 1, 1], bool),
                                                              np.array([1, 1, 0, 1], bool)],
        spans=[[TurnSpan("model", 2), TurnSpan("environment", 1), TurnSpan("model", 2)],
               [TurnSpan("model", 2), TurnSpan("tool", 1, ("lookup",)), TurnSpan("model", 1)]])
    return codec.decode_groups([bytes(memoryview(f).cast("B")) for f in codec.encode_groups([g])])[0]


def test_an_episodes_record_holds_its_turns_in_order_with_their_roles_decoded_from_its_tokens():
    cfg = config.load(None, ["advantage.r_min_correct=1.0"])
    first, second = records([episode_group()], 3, 3, cfg, decode, 8)
    assert first["completion"] == "d c same c a" and first["turns"] == 2 and first["tool_calls"] == {}
    assert first["conversation"] == [{"role": "model", "text": "d c"}, {"role": "environment", "text": "same"},
                                     {"role": "model", "text": "c a"}]
    assert second["conversation"] == [{"role": "model", "text": "lookup a"},
                                      {"role": "tool", "text": "7", "tools": ["lookup"]},
                                      {"role": "model", "text": "a"}]
    assert "conversation" not in records([group("a", [1.0], 0)], 0, 0, cfg, decode, 8)[0]  # single-turn: none
    long = {**first, "conversation": [{"role": "model", "text": "x" * 300}, {"role": "environment", "text": "y"}]}
    bad = episode_group()
    bad.samples[0] = msgspec.structs.replace(bad.samples[0], turn_layout=[0, 2, 1, 1, 0, 9])  # 12 tokens of 5
    broken, fine = records([bad], 3, 3, cfg, decode, 8)
    assert broken["conversation_error"] == "its turns hold 12 tokens, its completion 5" and "conversation" not in \
        broken and fine["conversation"] == second["conversation"] and broken["completion"] == "d c same c a"
    clipped = bounded(long, 100)["conversation"]  # the turns share the record's bound
    assert clipped[0]["truncated"] == 300 and len(clipped[0]["text"]) < 100 and clipped[1] == {"role": "environment",
                                                                                                 "text": "y"}


def test_streamrl_samples_prints_a_two_turn_episode_turn_by_turn_with_its_roles_and_counts(tmp_path, capsys):
    cfg = config.load(None, ["advantage.r_min_correct=1.0"])
    got = records([episode_group()], 3, 3, cfg, decode, 8)
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in got))
    assert cli.main(["samples", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    at = out.index("    2 model turns, 1 environment turn, 0 tool turns; tool calls: none")
    assert out[at + 1:at + 4] == ["    ▶ model        d c", "      environment  same", "    ▶ model        c a"], out
    at = out.index("    2 model turns, 0 environment turns, 1 tool turn; tool calls: lookup/ok ×1")
    assert out[at + 1:at + 4] == ["    ▶ model        lookup a", "      tool lookup  7", "    ▶ model        a"], out
    assert not any(line.startswith("    | ") for line in out)  # the flat completion gives way to the turns
