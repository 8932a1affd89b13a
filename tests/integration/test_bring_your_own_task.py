"""Bring your own task (docs/guides/bring-your-own-task.md), proved with real processes on the tiny CPU model: a
plug-in package installed from examples/ registers a task that trains; a chat-message dataset with a reward
file in TRL's signature trains; a reward that raises and hangs is counted exactly and stops no actor;
`streamrl check` names every malformed row."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest
from procs import FREE_PORTS, REPO, metrics, streamrl, summary

pytestmark = pytest.mark.slow
EXAMPLES = REPO / "examples"
QUIET = [*FREE_PORTS, "monitoring.learner_port=0", "monitoring.actor_port=0"]


def chat_data(folder):
    subprocess.run([sys.executable, str(EXAMPLES / "chat-dataset" / "make_data.py"), str(folder)], check=True)
    shutil.copy(EXAMPLES / "chat-dataset" / "reward.py", folder / "reward.py")


@pytest.mark.long
def test_an_installed_plug_in_registers_a_task_that_trains(tmp_path, monkeypatch):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--quiet",
                    "--target", str(target), str(EXAMPLES / "swap-task")], check=True, cwd=tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(target))  # the children read the plug-in's metadata from here too
    listed = streamrl("tasks", cwd=tmp_path).stdout
    assert "swap" in listed and "streamrl_swap:Swap (entry point, streamrl-swap-task 0.1.0)" in listed, listed
    assert "streamrl.tasks.symbols:Copy (entry point, streamrl" in listed, listed
    streamrl("run", str(REPO / "configs" / "tiny.yaml"), "task.name=swap", "name=swap", "steps=200",
             "optim.lr=1e-3", f"run_dir={tmp_path / 'runs'}", *QUIET, cwd=tmp_path, timeout=600)
    s = summary(tmp_path / "runs" / "swap")
    assert s["status"] == "finished" and s["improvement_fraction_of_range"] >= 0.2, s


@pytest.mark.long
def test_a_chat_dataset_with_a_trl_reward_file_trains_from_near_chance(tmp_path):
    chat_data(tmp_path)
    streamrl("run", str(EXAMPLES / "chat-dataset" / "config.yaml"), f"run_dir={tmp_path / 'runs'}", *QUIET,
             cwd=tmp_path, timeout=600)
    s = summary(tmp_path / "runs" / "chat-dataset")
    # Chance: two words drawn from ~15 give the answer first about 1/15 of the time, later about as often.
    assert s["status"] == "finished" and s["reward_first_10pct"] < 0.3, s
    assert s["reward_last_10pct"] - s["reward_first_10pct"] >= 0.3, s
    assert s["reward_failures"] == {}, s


FAULTY = '''
import os, random, time

def flaky(prompts, completions, answer, **kwargs):
    """Per call: each sample raises with p=0.10 or hangs past the timeout with p=0.05; logs what it did."""
    rng = random.Random()
    draws = [rng.random() for _ in completions]
    action = "raise" if any(d < 0.10 for d in draws) else "sleep" if any(d < 0.15 for d in draws) else "ok"
    with open(os.environ["FLAKY_LOG"], "a") as f:
        f.write(f"{len(completions)} {action}\\n")
    if action == "raise":
        raise RuntimeError("flaky reward")
    if action == "sleep":
        time.sleep(1.0)
    words = [(c[0]["content"] if isinstance(c, list) else c).split() for c in completions]
    return [1.0 if w[:1] == [a] else 0.5 if a in w else 0.0 for w, a in zip(words, answer)]
'''


@pytest.mark.long
def test_a_reward_that_raises_and_hangs_is_counted_exactly_and_stops_no_actor(tmp_path, monkeypatch):
    chat_data(tmp_path)
    (tmp_path / "flaky.py").write_text(FAULTY)
    log = tmp_path / "flaky.log"
    monkeypatch.setenv("FLAKY_LOG", str(log))
    streamrl("run", str(EXAMPLES / "chat-dataset" / "config.yaml"), "name=flaky", "steps=15",
             "task.reward=flaky.py:flaky", "task.reward_timeout_s=0.4", "task.reward_workers=16",
             f"run_dir={tmp_path / 'runs'}", *QUIET, cwd=tmp_path, timeout=600)
    s = summary(tmp_path / "runs" / "flaky")
    calls = [line.split() for line in log.read_text().splitlines()]
    # A group's failed call is repeated one sample at a time: a sample is counted by its own call's fate.
    singles = [action for n, action in calls if n == "1"]
    groups = [action for n, action in calls if n != "1"]
    assert groups.count("raise") > 0 and groups.count("sleep") > 0, calls[:20]
    assert singles.count("raise") > 0 and singles.count("sleep") > 0, calls[:20]
    expected = {k: v for k, v in {"raised": singles.count("raise"), "timeout": singles.count("sleep")}.items() if v}
    # Every failed call, retried or not: each raise, and each sleep but those of a group collected after the call
    # had returned (the actor was generating meanwhile: a late result is still taken).
    got = dict(s["reward_failures"])
    calls_failed = got.pop("calls_failed", 0)
    least = sum(action == "raise" for _, action in calls) + singles.count("sleep")
    assert least <= calls_failed <= sum(action != "ok" for _, action in calls), (calls_failed, least, calls[:20])
    assert s["status"] == "finished" and got == expected, (s["reward_failures"], expected)
    rec = s["reconciliation"]
    assert rec["actor_sessions"] == 2 and rec["unreported_sessions"] == [], rec  # both actors lived to report
    # metrics.jsonl: the counts so far at each step, carried by the groups as they arrive (never beyond the total)
    seen = [r["reward_failures"] for r in metrics(tmp_path / "runs" / "flaky")]
    assert any(seen), seen[:5]
    for before, after in zip(seen, seen[1:] + [got]):
        assert all(before.get(k, 0) <= after.get(k, 0) for k in ("raised", "timeout")), (before, after)


BROKEN = '''
def wrong_column(prompts, completions, **kwargs):
    return [1.0 if c[0]["content"] == a else 0.0 for c, a in zip(completions, kwargs["target"])]

def one_short(prompts, completions, answer, **kwargs):
    return [0.0] * (len(completions) - 1)
'''


@pytest.mark.parametrize("function,error", [("wrong_column", "KeyError: 'target'"),
                                            ("one_short", "expected a list of 8 floats or None")])
def test_a_reward_failing_on_every_call_stops_the_run_within_60s_naming_it_and_its_error(tmp_path, function, error):
    chat_data(tmp_path)
    (tmp_path / "broken.py").write_text(BROKEN)
    t0 = time.monotonic()
    out = streamrl("run", str(EXAMPLES / "chat-dataset" / "config.yaml"), "name=broken", "steps=300",
                   f"task.reward=broken.py:{function}", f"run_dir={tmp_path / 'runs'}", *QUIET, cwd=tmp_path,
                   timeout=120, check=False)
    took = time.monotonic() - t0
    assert out.returncode == 1, (out.returncode, out.stdout[-3000:], out.stderr[-3000:])
    assert took < 60, took  # today's code waited learner.data_timeout_s (300 s) and blamed the actors
    terminal = out.stdout + out.stderr
    assert f"reward function broken.py:{function} failed on" in terminal and error in terminal, terminal[-3000:]
    if function == "wrong_column":  # the user's own frame, with the line that raised
        assert 'broken.py", line 3, in wrong_column' in terminal and 'kwargs["target"]' in terminal, terminal[-3000:]
    s = summary(tmp_path / "runs" / "broken")
    reason = "raised" if function == "wrong_column" else "bad_return"
    assert s["status"] == "failed" and s["user_code_failure"]["reason"] == reason, s
    counts = s["user_code_failure"]["counts"]
    assert counts[reason] >= 50 and counts["calls_failed"] > counts[reason], counts  # every call, retries too
    assert s["reward_failures"].get(reason, 0) >= counts[reason], s["reward_failures"]


THIRDS = '''
import numpy as np

def thirds(prompts, completions, answer, **kwargs):
    words = [c[0]["content"].split() for c in completions]
    return np.array([1.0 if w[:1] == [a] else 2 / 3 if a in w else 1 / 3 if w else 0.0 for w, a in zip(words, answer)])
'''


def test_levels_written_0_33_and_0_67_train_a_reward_in_thirds_with_nothing_out_of_scale(tmp_path):
    chat_data(tmp_path)
    (tmp_path / "thirds.py").write_text(THIRDS)  # a numpy array, as TRL accepts
    streamrl("run", str(EXAMPLES / "chat-dataset" / "config.yaml"), "name=thirds", "steps=30",
             "task.reward=thirds.py:thirds", "task.reward_levels=[0, 0.33, 0.67, 1]", "advantage.r_min_correct=0.67",
             f"run_dir={tmp_path / 'runs'}", *QUIET, cwd=tmp_path, timeout=300)
    s = summary(tmp_path / "runs" / "thirds")
    assert s["status"] == "finished" and "out_of_scale" not in s["reward_failures"], s["reward_failures"]
    assert "bad_return" not in s["reward_failures"], s["reward_failures"]
    rewards = {r["reward_mean"] for r in metrics(tmp_path / "runs" / "thirds")}
    assert max(rewards) >= 0.33, sorted(rewards)  # today's code trained on the 0s alone: reward 0.000 throughout
    # what the model wrote: the samples log and `streamrl samples` show the completions the learner trained on
    logged = [json.loads(line) for line in (tmp_path / "runs" / "thirds" / "samples.jsonl").read_text().splitlines()]
    assert {r["step"] for r in logged} == {0, 10, 20} and all(r["reward"] in (0, 0.33, 0.67, 1) for r in logged)
    shown = streamrl("samples", str(tmp_path / "runs" / "thirds"), cwd=tmp_path).stdout
    assert shown.startswith("step 20  group 0") and "prompt: " in shown, shown
    assert any(f"    | {r['completion']}" in shown for r in logged if r["step"] == 20 and r["completion"]), shown


def test_check_calls_each_reward_on_rows_and_names_one_that_raises_even_beside_an_earlier_run(tmp_path):
    chat_data(tmp_path)
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "words.py").write_text("def first(text):\n    return text.split()[:1]\n")
    (tmp_path / "helpers" / "scored.py").write_text(  # imports a module beside it, with no PYTHONPATH
        "import words\n\ndef first(prompts, completions, answer, **kw):\n"
        "    return [1.0 if words.first(c[0]['content']) == [a] else 0.0 for c, a in zip(completions, answer)]\n")
    (tmp_path / "broken.py").write_text(BROKEN)
    (tmp_path / "runs" / "chat-dataset").mkdir(parents=True)
    (tmp_path / "runs" / "chat-dataset" / "summary.json").write_text('{"status": "finished"}')  # an earlier run
    config = str(EXAMPLES / "chat-dataset" / "config.yaml")
    good = streamrl("check", config, "task.reward=helpers/scored.py:first", f"run_dir={tmp_path / 'runs'}", *QUIET,
                    cwd=tmp_path)
    assert "task.reward helpers/scored.py:first on row 1 (its reference answer, then 'no'): [1.0, 0.0]" in good.stderr
    assert "already holds a run" in good.stderr and "`streamrl run` would refuse it" in good.stderr, good.stderr
    bad = streamrl("check", config, "task.reward=broken.py:wrong_column", f"run_dir={tmp_path / 'runs'}", *QUIET,
                   cwd=tmp_path, check=False)
    assert bad.returncode == 2, bad.stderr
    assert "task.reward broken.py:wrong_column on row 1 of train.jsonl: KeyError: 'target'" in bad.stderr, bad.stderr
    assert "broken.py:wrong_column failed on every row tried" in bad.stderr, bad.stderr


def test_check_names_every_malformed_row_and_a_file_without_one_is_refused_before_start(tmp_path):
    chat_data(tmp_path)
    good = (tmp_path / "train.jsonl").read_text().splitlines()[:3]
    (tmp_path / "broken.jsonl").write_text("\n".join([
        good[0], '{"prompt": 5, "answer": "x"}', "not json", good[1],
        json.dumps({"prompt": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]}),
        json.dumps({"text": "no prompt"}), good[2]]) + "\n")
    task = ["task.name=dataset", "task.reward=reward.py:first_word", "task.reward_levels=[0,0.5,1]",
            "advantage.r_min_correct=0.5", f"run_dir={tmp_path / 'runs'}"]
    out = streamrl("check", "task.data=broken.jsonl", *task, cwd=tmp_path)
    lines = [line for line in out.stderr.splitlines() if line.startswith("streamrl check: warning: broken.jsonl:")]
    assert [line.split("broken.jsonl:")[1].split(":")[0] for line in lines] == ["2", "3", "5", "6"], out.stderr
    assert "must be a string or a non-empty list of messages" in lines[0] and "not valid JSON" in lines[1]
    assert "a system message comes first" in lines[2] and "no 'prompt' field" in lines[3]
    assert "4 of 7 rows have a problem; a run skips them" in out.stderr
    (tmp_path / "hopeless.jsonl").write_text("nope\n" + json.dumps({"text": "x"}) + "\n")
    refused = streamrl("run", "task.data=hopeless.jsonl", "name=hopeless", *task, *QUIET, cwd=tmp_path, check=False)
    assert refused.returncode == 2, refused.stderr
    assert "task.data=hopeless.jsonl: no usable row of 2" in refused.stderr  # after each row's problem, as check
    assert "streamrl run: warning: hopeless.jsonl:1: not valid JSON" in refused.stderr
    assert not (tmp_path / "runs" / "hopeless").exists()  # refused before anything started
    missing = streamrl("check", "task.data=broken.jsonl", *task, "task.reward=reward.py:nope", cwd=tmp_path,
                       check=False)
    assert missing.returncode == 2 and "reward.py has no function 'nope'" in missing.stderr, missing.stderr
