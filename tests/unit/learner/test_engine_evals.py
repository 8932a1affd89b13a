"""In-training evaluation on the actors' engines: the shards and their seeds, eval sets from files, the
max_seq_len cap, and the learner's bookkeeping (learner/evals.py) over real ZeroMQ sockets on loopback: a
shard asked of one actor and not answered in time is asked of the other, its answer is recorded once, a late
or malformed answer is counted and never recorded."""

from __future__ import annotations

import collections
import json
import runpy
import shutil
import time
from pathlib import Path

import pytest
import zmq

from streamrl import config, evaluation
from streamrl.comm import codec, wire
from streamrl.comm.control import ControlServer, Inbox
from streamrl.comm.groups import GroupReceiver, GroupSender
from streamrl.comm.weights.publisher import WeightPublisher
from streamrl.comm.weights.subscriber import WeightSubscriber
from streamrl.learner.evals import Evals
from streamrl.tasks import rewards
from streamrl.telemetry import prometheus_metrics

ANY = "tcp://127.0.0.1:*"
CHAT = Path(__file__).resolve().parents[3] / "examples" / "chat-dataset"


def bound(sock) -> str:
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def test_shards_cover_every_row_once_and_a_shards_seed_depends_on_its_rows_only():
    sets = [evaluation.EvalSet("a", list(range(10)), None), evaluation.EvalSet("b", list(range(2)), None)]
    got = evaluation.shards(sets, 3)
    assert got == [("a", 0, 3), ("a", 3, 6), ("a", 6, 10), ("b", 0, 1), ("b", 1, 2)]
    assert evaluation.shard_seed(7, evaluation.Shard("a", 3, 6)) == evaluation.shard_seed(7, evaluation.Shard("b", 3, 9))


def test_temperature_zero_samples_the_most_likely_token_every_time():
    import torch

    from streamrl.models import model, sampling

    cfg = config.load(None, ["eval.temperature=0", "actors.max_new_tokens=5"])
    m, tok = model.build(cfg, rewards.build(cfg).task.vocabulary)
    ids = [tok("copy : a b c d =", add_special_tokens=False)["input_ids"]]
    sample = evaluation.local_sampler(m, tok, cfg.eval.temperature)
    a, b = sample(ids, 3, 5, seed=1)[0], sample(ids, 3, 5, seed=2)[0]
    assert [c.tokens for c in a] == [c.tokens for c in b] == [a[0].tokens] * 3  # no draw at all
    with torch.no_grad():  # each token is the argmax of the logits after the tokens before it
        for t, token in enumerate(a[0].tokens):
            logits = m(input_ids=torch.tensor([ids[0] + a[0].tokens[:t]])).logits[0, -1]
            assert token == int(logits.argmax())
    hf = sampling.generate_hf(sampling_reference(m), ids, 1, temperature=0.0, max_new_tokens=5, pad_id=tok.pad_token_id,
                              eos_id=tok.eos_token_id)
    assert hf[0][0].tokens == a[0].tokens  # transformers' greedy generate agrees


def sampling_reference(m):
    from streamrl.models import tiny_llama

    return tiny_llama.to_transformers(m)


def _chat(tmp_path: Path, *overrides: str):
    rows = runpy.run_path(str(CHAT / "make_data.py"))["rows"]
    for name, n, seed in (("train", 20, 0), ("a", 5, 1), ("b", 3, 2)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(n, seed)))
    shutil.copy(CHAT / "reward.py", tmp_path / "reward.py")
    cfg = config.load(str(CHAT / "config.yaml"), [
        f"task.data={tmp_path / 'train.jsonl'}", "task.eval_data=null", f"task.reward={tmp_path / 'reward.py'}:first_word",
        f"eval.sets={{a: {tmp_path / 'a.jsonl'}, b: {tmp_path / 'b.jsonl'}}}", "eval.prompts=all", "eval.samples=2",
        "eval.ks=[1,2]", *overrides])
    return cfg, rewards.build(cfg)


def test_each_eval_set_is_read_from_its_file_and_reported_apart(tmp_path):
    cfg, reward = _chat(tmp_path)
    try:
        sets = evaluation.eval_sets(cfg, reward.task)
        assert [(s.name, len(s.prompts)) for s in sets] == [("a", 5), ("b", 3)]
        out = evaluation.Evaluator(cfg, reward).run()
    finally:
        reward.task.functions.close()
    assert out["eval/a/prompts"] == 5 and out["eval/b/prompts"] == 3 and "eval/prompts" not in out
    assert {k.split("/")[1] for k in out if k.count("/") == 2} == {"a", "b"}


def test_a_task_without_eval_files_refuses_eval_sets_by_name():
    cfg = config.load(None, ["eval.sets={x: nowhere.jsonl}"])
    with pytest.raises(ValueError, match=r"eval.sets.x=nowhere.jsonl: task 'copy' reads no eval file"):
        evaluation.eval_sets(cfg, rewards.build(cfg).task)


def test_evaluation_skips_prompts_with_no_room_under_max_seq_len_and_caps_the_rest(tmp_path):
    cfg, reward = _chat(tmp_path, "model.max_seq_len=8", "eval.max_new_tokens=6")
    words = ["red", "green", "blue", "black", "white"]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({  # prompts of 6 to 10 tokens
        "prompt": [{"role": "system", "content": "Answer with the first word."},
                   {"role": "user", "content": " ".join(words[:k])}], "answer": "red"}) + "\n" for k in range(1, 6)))
    try:
        ev = evaluation.Evaluator(cfg, reward)
        lengths = [len(ev.encode(p)) for p in ev.sets[0].prompts]
        drawn: list[int] = []
        inner = ev.sample

        def sample(ids, n, max_new_tokens, seed):
            drawn.append(max_new_tokens)
            assert all(len(i) < 8 for i in ids)  # no prompt without room reaches the engine
            return inner(ids, n, max_new_tokens, seed)

        scores = evaluation.score_shard(sample, ev.tokenizer, reward, ev.sets[0].prompts, cfg, 1)
    finally:
        reward.task.functions.close()
    too_long = sum(n >= 8 for n in lengths)
    assert 0 < too_long < len(lengths), lengths  # the cap is chosen so both kinds occur
    assert [not row for row in scores.rewards] == [n >= 8 for n in lengths]
    assert drawn == [8 - min(lengths)] and drawn[0] < 6  # the longest room the call's prompts leave, under the cap
    out = evaluation.set_metrics(cfg, ev.sets[0], [scores])
    assert out["eval/a/prompts_too_long"] == too_long and out["eval/a/prompts"] == len(lengths) - too_long


class _Actor:
    """An actor's channels, as actors/main.py has them: the weight subscriber with its control inbox, and the group
    PUSH."""

    def __init__(self, ctx, pub: WeightPublisher, control: ControlServer, receiver: GroupReceiver, actor_id: str):
        self.inbox = Inbox(ctx, bound(control.sock), actor_id, 1 << 20)
        self.sub = WeightSubscriber(ctx, bound(pub.pub), self.inbox, 1 << 20)
        self.sender = GroupSender(ctx, bound(receiver.sock), 4, actor_id)
        self.sub.request(-1)  # what makes the learner know its address
        self.sender.send(codec.ScoredGroup.from_samples(
            prompt_id="p", policy_version=0, actor_id=actor_id, prompt_tokens=[5], completions=[[6], [7]],
            logprobs=[[-0.5], [-0.5]], rewards=[0.0, 1.0], finish_reasons=["stop", "stop"]), 5.0)

    def request(self, timeout_s: float = 5.0) -> wire.EvalRequest | None:
        deadline = time.monotonic() + timeout_s
        while not self.inbox.eval_requests and time.monotonic() < deadline:
            self.sub.watch(50)
        return self.inbox.take_eval()

    def close(self):
        self.sub.close()
        self.inbox.close()
        self.sender.close()


def test_an_overdue_shard_is_asked_of_the_other_actor_and_recorded_once(tmp_path):
    cfg = config.load(None, ["eval.every=1", "eval.prompts=4", "eval.samples=2", "eval.ks=[1,2]",
                             "eval.timeout_s=10", f"run_dir={tmp_path}", "name=t"])
    cfg.run_path.mkdir()  # the run directory, as the learner's RunLog makes it
    ctx = zmq.Context()
    pub = WeightPublisher(ctx, ANY, max_bytes=1 << 20)
    control = ControlServer(ctx, ANY, pub)
    receiver = GroupReceiver(ctx, ANY, 4, 1 << 20, None)
    telemetry = prometheus_metrics.LearnerMetrics(prometheus_metrics.new_registry(), "t", "corpo", [0.0, 1.0], 2)
    now = [0.0]
    dropped: collections.Counter = collections.Counter()
    evals = Evals(cfg, rewards.build(cfg).task, control, receiver, telemetry, dropped, clock=lambda: now[0])
    actors = [_Actor(ctx, pub, control, receiver, f"actor-{i}") for i in range(2)]
    try:
        deadline = time.monotonic() + 5
        while len(control.actor_peers) < 2 or len(receiver.sessions) < 2:  # the learner's poller does this
            assert time.monotonic() < deadline
            receiver.sock.poll(20)
            receiver.take()
            control.serve()
        evals.request(step=4, version=5)
        first = actors[0].request()
        assert (first.version, first.set, first.start, first.stop, first.attempt) == (5, "", 0, 4, 0)
        assert first.seed == cfg.eval.seed
        assert evals.take() == {} and actors[1].request(0.2) is None  # not overdue yet: nobody else asked
        now[0] = 11.0
        assert evals.take() == {}
        again = actors[1].request()
        assert (again.version, again.start, again.stop, again.attempt) == (5, 0, 4, 1)
        table = [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.5, 0.25]]
        bad = wire.EvalResult(actor_id="actor-1", version=5, set="", start=0, stop=4, rewards=table[:3])
        good = wire.EvalResult(actor_id="actor-1", version=5, set="", start=0, stop=4, rewards=table, eval_s=0.5)
        late = wire.EvalResult(actor_id="actor-0", version=5, set="", start=0, stop=4, rewards=table)
        actors[1].sender.notice(bad, 5.0)  # three rows for a four-row shard: counted, asked again
        rec = _take_when(evals, receiver, lambda: evals.ignored["eval_shape"])
        assert rec == {} and actors[0].request().attempt == 2
        actors[1].sender.notice(good, 5.0)
        rec = _take_when(evals, receiver, lambda: evals.ready or not evals.rounds, take=True)
        actors[0].sender.notice(late, 5.0)
        _take_when(evals, receiver, lambda: evals.ignored["late"])
    finally:
        for a in actors:
            a.close()
        control.close()
        pub.close()
        receiver.close()
        ctx.term()
    want = evaluation.summarize(table, cfg.advantage.r_min_correct, [1, 2])
    assert {k: rec[k] for k in want} == want
    assert (rec["eval_version"], rec["eval_step"], rec["eval_actors"], rec["eval_reissued"]) == (5, 4, {"actor-1": 1}, 2)
    assert rec["eval_results_ignored"] == {"eval_shape": 1}
    assert evals.ignored == {"eval_shape": 1, "late": 1} and evals.take() == {}  # recorded once
    lines = (tmp_path / "t" / "evals.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["eval/pass@1"] == rec["eval/pass@1"]


def _take_when(evals: Evals, receiver: GroupReceiver, done, take: bool = False) -> dict:
    """What evals.take returns once `done()` (the receiver read as the intake reads it meanwhile)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        receiver.sock.poll(20)
        receiver.take()
        evals.poll()
        if done():
            return evals.take() if take else {}
    raise AssertionError("the eval answer never arrived")


def test_a_version_due_for_evaluation_is_kept_and_the_newest_comes_again_after_going_back():
    import torch

    ctx = zmq.Context()
    pub = WeightPublisher(ctx, ANY, max_bytes=1 << 20)
    control = ControlServer(ctx, ANY, pub)
    inbox = Inbox(ctx, bound(control.sock), "actor-0", 1 << 20)
    sub = WeightSubscriber(ctx, bound(pub.pub), inbox, 1 << 20)
    sub.keep = lambda version: version % 2 == 0  # eval.every=2, as actors/weights.py sets it

    def serving() -> bool:  # the learner's side of the requests, in this thread
        control.serve()
        return False

    try:
        pub.publish(2, {"w": torch.full((3,), 2.0)})
        assert sub.wait_for(2, 5.0, ask_first=True, ask_every_s=0.2, stop=serving)[0] == 2
        pub.publish(3, {"w": torch.full((3,), 3.0)})
        got = sub.wait_for(3, 5.0, ask_every_s=0.2, stop=serving)
        assert got[0] == 3 and sub.kept[0] == 2 and torch.equal(sub.kept[1]["w"], torch.full((3,), 2.0))
        sub.rewind(2)  # the actor went back to version 2 to evaluate it: version 3, sent again, is taken in again
        again = sub.wait_for(3, 5.0, ask_every_s=0.2, stop=serving)
        assert again[0] == 3 and torch.equal(again[1]["w"], torch.full((3,), 3.0))
        # an eval request wakes an actor waiting for newer weights (it evaluates, then waits again)
        assert control.send_to("actor-0", wire.EvalRequest(version=2, set="", start=0, stop=1, seed=0))
        assert sub.wait_for(4, 5.0, ask_every_s=0.2, stop=serving) is None
        assert [r.version for r in inbox.eval_requests] == [2]
    finally:
        sub.close()
        inbox.close()
        control.close()
        pub.close()
        ctx.term()


def test_an_evaluation_slower_than_eval_every_steps_makes_the_step_before_the_last_wait_so_each_gets_a_record():
    cfg = config.load(None, ["eval.every=4", "steps=12"])
    evals = Evals.__new__(Evals)  # owed() reads the schedule and the bookkeeping only
    evals.cfg, evals.ready, evals.rounds = cfg, [], {}

    def waits(step: int) -> bool:  # learner/main.py's rule
        return evals.owed(step, cfg.steps) >= cfg.steps - step

    assert not any(waits(s) for s in range(11))  # nothing out: no step before the last waits
    evals.rounds = {8: object()}  # version 8 (asked at step 7) still out at steps 8..10
    assert not waits(8) and not waits(9)
    assert waits(10)  # else versions 8 and 12 would both come back at step 11, one record for two
    evals.rounds = {12: object()}
    assert waits(11)  # the run's last step waits for the evaluation it asked for
    evals.ready = [{"eval_version": 8}]
    assert evals.owed(11, 12) == 2


def test_groups_read_while_a_step_waits_for_an_evaluation_are_handed_back_for_training_not_dropped(tmp_path):
    cfg = config.load(None, ["eval.every=1", "eval.prompts=4", "eval.samples=2", "eval.ks=[1,2]",
                             "eval.timeout_s=0.5", f"run_dir={tmp_path}", "name=t"])
    cfg.run_path.mkdir()
    ctx = zmq.Context()
    pub = WeightPublisher(ctx, ANY, max_bytes=1 << 20)
    control = ControlServer(ctx, ANY, pub)
    receiver = GroupReceiver(ctx, ANY, 64, 1 << 20, None)
    telemetry = prometheus_metrics.LearnerMetrics(prometheus_metrics.new_registry(), "t", "corpo", [0.0, 1.0], 2)
    dropped: collections.Counter = collections.Counter()
    evals = Evals(cfg, rewards.build(cfg).task, control, receiver, telemetry, dropped)
    sender = GroupSender(ctx, bound(receiver.sock), hwm=64, actor_id="actor-0")
    try:
        g = codec.ScoredGroup.from_samples(prompt_id="p", policy_version=0, actor_id="actor-0", prompt_tokens=[1],
                                           completions=[[2]] * 2, logprobs=[[-1.0]] * 2, rewards=[0.0, 1.0],
                                           finish_reasons=["stop"] * 2)
        for _ in range(3):
            assert sender.send(g, timeout_s=2)
        evals.request(step=3, version=4)  # nobody answers: the wait ends at eval.timeout_s
        assert evals.take(wait=True, last=False) == {}
        assert not dropped and receiver.received == 3  # read past, counted once, kept
        assert [receiver.take().seq for _ in range(3)] == [0, 1, 2] and receiver.take() is None
        assert receiver.received == 3
    finally:
        for s in (sender, receiver, control, pub):
            s.close()
        ctx.term()
