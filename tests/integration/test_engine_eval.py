"""Evaluation during training on the actors' engines (issue 29): two actors share each evaluation of three eval
sets, every `eval.every` steps, and `streamrl eval` on each file repeats their numbers exactly; an actor killed
in the middle of an evaluation has its shard run again by the other, and the version's results still come."""

from __future__ import annotations

import json
import os
import runpy
import shutil
import signal
import time
from pathlib import Path

import pytest
from procs import FREE_PORTS, REPO, free_ports, metrics, reaped, spawn, streamrl, summary

from streamrl.commands import eval_cli

pytestmark = pytest.mark.slow
CHAT = REPO / "examples" / "chat-dataset"
QUIET = [*FREE_PORTS, "monitoring.learner_port=0", "monitoring.actor_port=0"]
SETS = {"code": (12, 11), "pairs": (6, 12), "math": (9, 13)}  # name: (rows, seed) of a chat-dataset eval file


def _eval_files(folder: Path) -> dict[str, Path]:
    rows = runpy.run_path(str(CHAT / "make_data.py"))["rows"]
    files = {}
    for name, (n, seed) in SETS.items():
        files[name] = folder / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(r) + "\n" for r in rows(n, seed)))
    return files


def _sets(files: dict[str, Path]) -> str:
    return "eval.sets={" + ", ".join(f"{k}: {v}" for k, v in files.items()) + "}"


def test_two_actors_evaluate_three_sets_every_n_steps_and_streamrl_eval_repeats_each(tmp_path):
    shutil.copy(CHAT / "reward.py", tmp_path / "reward.py")
    (tmp_path / "train.jsonl").write_text("".join(
        json.dumps(r) + "\n" for r in runpy.run_path(str(CHAT / "make_data.py"))["rows"](200, 0)))
    files = _eval_files(tmp_path)
    streamrl("run", str(CHAT / "config.yaml"), "name=sets", f"run_dir={tmp_path / 'runs'}", "steps=12",
             f"task.data={tmp_path / 'train.jsonl'}", f"task.reward={tmp_path / 'reward.py'}:first_word",
             "task.eval_data=null",
             "eval.every=4", "eval.actors=2", "eval.prompts=all", "eval.samples=4", "eval.ks=[1,4]", _sets(files),
             *QUIET, cwd=tmp_path, timeout=300)
    run = tmp_path / "runs" / "sets"
    recs = metrics(run)
    evals = [r for r in recs if "eval_version" in r]
    assert [r["eval_step"] for r in evals] == [3, 7, 11] and [r["eval_version"] for r in evals] == [4, 8, 12]
    assert all(r["step"] >= r["eval_step"] for r in evals)  # recorded when they came back, never before
    for r in evals:
        assert sum(r["eval_actors"].values()) == 6 and set(r["eval_actors"]) <= {"actor-0", "actor-1"}
        for name, (n, _) in SETS.items():  # each set on its own, every row of its file
            assert r[f"eval/{name}/prompts"] == n and 0 <= r[f"eval/{name}/pass@1"] <= r[f"eval/{name}/pass@4"] <= 1
        assert "eval/pass@1" not in r  # no figure over the three sets mixed
    assert [json.loads(x)["eval_version"] for x in (run / "evals.jsonl").read_text().splitlines()] == [4, 8, 12]
    assert len({r["eval/code/reward_mean"] for r in evals} | {r["eval/math/reward_mean"] for r in evals}) > 1
    last = evals[-1]
    for name, path in files.items():  # the saved final policy, one file at a time: the actors' numbers exactly
        got = eval_cli.offline(run, [f"eval.sets={{{name}: {path}}}"], tmp_path / f"{name}.json")  # `streamrl eval`
        assert got["policy_version"] == 12
        mine = {k: v for k, v in got.items() if k.startswith(f"eval/{name}/")}
        assert len(mine) >= 8 and mine == {k: v for k, v in last.items() if k.startswith(f"eval/{name}/")}
    assert summary(run)["status"] == "finished"


@pytest.mark.long
def test_an_actor_killed_mid_eval_has_its_shard_run_again_by_the_other(tmp_path):
    group, weights, requests = free_ports(3)
    args = [str(REPO / "configs" / "tiny.yaml"), "name=kill", f"run_dir={tmp_path / 'runs'}", "steps=20",
            f"transport.group_port={group}", f"transport.weights_port={weights}",
            f"transport.weights_request_port={requests}", "monitoring.learner_port=0", "monitoring.actor_port=0",
            "eval.every=10", "eval.timeout_s=2", "learner.slow_step_s=0.2", "learner.shutdown_drain_s=1"]
    marker = tmp_path / "held"
    hold = Path(__file__).parent / "hold_eval"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(hold), os.environ.get("PYTHONPATH")])),
           "STREAMRL_TEST_HOLD_EVAL": str(marker)}
    run = tmp_path / "runs" / "kill"
    learner = spawn(["learner", *args], tmp_path / "learner.log")
    old = dict(os.environ)
    os.environ.update(env)  # the actors load the hook; the learner does not need it
    try:
        actors = [spawn(["actor", *args, "--index", str(i)], tmp_path / f"actor-{i}.log") for i in range(2)]
    finally:
        os.environ.clear()
        os.environ.update(old)
    with reaped(learner, actors):
        deadline = time.monotonic() + 120
        while not (marker.exists() and marker.read_text()):  # an actor is inside its evaluation, holding it
            assert time.monotonic() < deadline and learner.poll() is None, "no actor started evaluating"
            time.sleep(0.05)
        pid, version = map(int, marker.read_text().split())
        os.kill(pid, signal.SIGKILL)
        killed = next(i for i, a in enumerate(actors) if a.pid == pid)
        assert learner.wait(timeout=240) == 0, (tmp_path / "learner.log").read_text()[-3000:]
    survivor = f"actor-{1 - killed}"
    evals = {r["eval_version"]: r for r in metrics(run) if "eval_version" in r}
    assert version == 10 and sorted(evals) == [10, 20]
    held = evals[10]
    assert held["eval_actors"] == {survivor: 1} and held["eval_reissued"] >= 1
    assert held["eval/prompts"] == 32 and 0 <= held["eval/pass@1"] <= held["eval/pass@8"] <= 1
    assert "no answer in eval.timeout_s" in (tmp_path / "learner.log").read_text()
