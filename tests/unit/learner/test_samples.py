"""The samples log (streamrl.learner.samples) and `streamrl samples` (streamrl.commands.samples): whole groups in
batch order, bounded, with the estimator's advantages and each group's lag; printed readably, ranked on request."""

from __future__ import annotations

import json

import pytest

from streamrl import config
from streamrl.comm.codec import ScoredGroup
from streamrl.commands import cli, samples as samples_cli
from streamrl.learner.samples import SamplesLog, records

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
