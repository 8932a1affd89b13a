"""learner.pacing on live sockets: each batch takes each actor's share (so the actors' budgets hold to the bound and
nothing arrives past it), an actor joining is counted in from the next version and every actor is told, and a
measured drift over max_drift holds the actors to one share per version."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from streamrl import config
from streamrl.algo import staleness
from streamrl.comm import codec, wire
from streamrl.comm.control import ControlServer, Inbox
from streamrl.comm.groups import GroupReceiver, GroupSender
from streamrl.comm.weights.publisher import WeightPublisher
from streamrl.learner.intake import Intake
from streamrl.learner.pacing import Pacer
from streamrl.learner.session import Poller

pytestmark = pytest.mark.timeout(60)
ANY = "tcp://127.0.0.1:*"


@pytest.fixture
def learner():
    """(ctx, receiver, control, make_intake(cfg overrides, strict))"""
    ctx = zmq.Context()
    receiver = GroupReceiver(ctx, ANY, hwm=64, max_bytes=1 << 20, vocab_size=32)
    publisher = WeightPublisher(ctx, ANY, 1 << 20)
    control = ControlServer(ctx, ANY, publisher)
    made = []

    def make(*overrides: str, demand_after_s: float = 0.3) -> Intake:
        cfg = config.load(None, ["learner.batch_groups=4", "actors.num=2", "actors.group_size=2", *overrides])
        it = Intake(receiver, control, group_size=2, max_staleness=cfg.max_staleness, demand_after_s=demand_after_s,
                    strict=cfg.strict, wait=Poller(receiver, control))
        it.pacer = Pacer(cfg, control)
        return it

    yield ctx, receiver, control, make, made
    for s in made:
        s.close()
    for s in (receiver, control, publisher):
        s.close()
    ctx.term()


def sender(ctx, receiver, actor: str, made: list) -> GroupSender:
    s = GroupSender(ctx, receiver.sock.getsockopt_string(zmq.LAST_ENDPOINT), hwm=64, actor_id=actor)
    made.append(s)
    return s


def group(actor: str, version: int) -> codec.ScoredGroup:
    return codec.ScoredGroup.from_samples(
        prompt_id="p", policy_version=version, actor_id=actor, prompt_tokens=[1, 2], completions=[[3]] * 2,
        logprobs=[[-1.0]] * 2, rewards=[0.0, 1.0], finish_reasons=["length"] * 2)


def actors_of(batch) -> dict[str, int]:
    out: dict[str, int] = {}
    for g in batch:
        out[g.actor_id] = out.get(g.actor_id, 0) + 1
    return out


def test_a_batch_takes_each_actors_share_and_holds_the_rest_for_the_next_so_none_goes_stale(learner):
    ctx, receiver, control, make, made = learner
    it = make("max_staleness=1")
    a, b = sender(ctx, receiver, "actor-0", made), sender(ctx, receiver, "actor-1", made)
    # actor-0 runs to its bound, (1 + k) shares of version 0, before actor-1's first groups arrive; taken as they
    # come, version 0's batch would be all actor-0's and actor-1's groups would land a version later than its budget
    # counted on.
    assert a.send_batch([group("actor-0", 0) for _ in range(4)], timeout_s=2)
    time.sleep(0.2)
    assert b.send_batch([group("actor-1", 0) for _ in range(2)], timeout_s=2)
    first, _ = it.collect(version=0, n=4, timeout_s=10)
    assert actors_of(first) == {"actor-0": 2, "actor-1": 2} and len(it.held) == 2
    assert b.send_batch([group("actor-1", 1) for _ in range(2)], timeout_s=2)
    second, _ = it.collect(version=1, n=4, timeout_s=10)
    assert actors_of(second) == {"actor-0": 2, "actor-1": 2}
    assert [g.policy_version for g in second if g.actor_id == "actor-0"] == [0, 0]  # held ones first, in order
    assert not it.dropped and not it.held


def test_a_demand_lets_the_batch_take_the_groups_held_past_a_missing_actors_share(learner):
    ctx, receiver, control, make, made = learner
    it = make("max_staleness=1")
    a = sender(ctx, receiver, "actor-0", made)
    assert a.send_batch([group("actor-0", 0) for _ in range(4)], timeout_s=2)  # actor-1 never comes
    batch, _ = it.collect(version=0, n=4, timeout_s=10)
    assert actors_of(batch) == {"actor-0": 4} and it.demands_sent == 1
    assert it.pacer.shares(1) is None  # actors cover with raised shares for a while: so does the batch


def test_an_actor_joining_is_counted_in_from_the_next_version_and_every_actor_is_told(learner):
    ctx, receiver, control, make, made = learner
    it = make("on_policy=strict")
    endpoint = control.sock.getsockopt_string(zmq.LAST_ENDPOINT)
    inboxes = [Inbox(ctx, endpoint, f"actor-{i}", 1 << 20) for i in range(3)]
    made.extend(inboxes)
    for box in inboxes[:2]:
        box.request(-1)
    a, b = sender(ctx, receiver, "actor-0", made), sender(ctx, receiver, "actor-1", made)
    for s, actor in ((a, "actor-0"), (b, "actor-1")):
        assert s.send_batch([group(actor, 150) for _ in range(2)], timeout_s=2)
    it.collect(version=150, n=4, timeout_s=10)
    assert it.pacer.shares(151) == {"actor-0": 2, "actor-1": 2}
    inboxes[2].request(-1)  # `streamrl actor --index 2` while the learner fills version 151's batch
    for s, actor in ((a, "actor-0"), (b, "actor-1")):
        assert s.send_batch([group(actor, 151) for _ in range(2)], timeout_s=2)
    it.collect(version=151, n=4, timeout_s=10)
    assert it.pacer.shares(151) == {"actor-0": 2, "actor-1": 2}
    assert it.pacer.shares(152) == {"actor-0": 2, "actor-1": 1, "actor-2": 1}
    for box in inboxes:
        deadline = time.monotonic() + 5
        while box.pace is None and time.monotonic() < deadline:
            box.receive()
            time.sleep(0.01)
        assert box.pace == wire.Pace(version=152, lead=0, actors=["actor-0", "actor-1", "actor-2"]), box.actor_id
    # A group the joiner made from version 151's weights before it was counted in is surplus: dropped and counted,
    # never a strict failure (the others made that version's batch).
    c = sender(ctx, receiver, "actor-2", made)
    assert c.send_batch([group("actor-2", 151)], timeout_s=2)
    for s, actor in ((a, "actor-0"), (a, "actor-0"), (b, "actor-1"), (c, "actor-2")):
        assert s.send_batch([group(actor, 152)], timeout_s=2)
    batch, _ = it.collect(version=152, n=4, timeout_s=10)
    assert actors_of(batch) == {"actor-0": 2, "actor-1": 1, "actor-2": 1} and it.dropped["stale"] == 1


def test_drift_over_max_drift_holds_the_actors_to_one_share_a_version_and_under_it_releases_them_a_version_a_step(
        learner):
    ctx, receiver, control, make, made = learner
    it = make("max_staleness=4", "max_drift=0.01")
    inbox = Inbox(ctx, control.sock.getsockopt_string(zmq.LAST_ENDPOINT), "actor-0", 1 << 20)
    made.append(inbox)
    inbox.request(-1)
    deadline = time.monotonic() + 5
    while not control.actor_peers and time.monotonic() < deadline:
        control.serve()
        time.sleep(0.01)
    paces = []
    for version, drift in ((3, 0.001), (4, 0.05), (5, 0.2), (6, 0.004), (7, 0.002), (8, 0.003)):
        it.pacer.observed(version, drift)
        time.sleep(0.1)
        inbox.receive()
        if (p := inbox.take_pace()) is not None:
            paces.append((p.version, p.lead, p.drift))
    # Told once when it went over (hold), then one version further ahead per step back under the bound.
    assert paces == [(5, 0, 0.05), (7, 1, 0.004), (8, 2, 0.002), (9, 3, 0.003)]


@pytest.mark.parametrize("paced", [True, False])
def test_one_actor_slower_for_a_moment_loses_groups_as_stale_unless_each_batch_takes_each_actors_share(
        learner, paced):
    """The default job's 8 to 12 stale groups, step by step (max_staleness 1, batches of 4, shares of 2; every send
    within the sender's throttle budget): actor-1 is late with version 0's groups once. Taken as they come, version
    0's batch is all actor-0's, actor-1's groups are taken a version later than its budget counted on, and its last
    two arrive at lag 2. Paced, every batch takes 2 of each and nothing goes stale."""

    ctx, receiver, control, make, made = learner
    it = make("max_staleness=1", demand_after_s=5.0)  # actor-1 is late, not gone: no demand
    if not paced:
        it.pacer = None  # as the intake took groups before (and still does for actors.throttle=false)
    a, b = sender(ctx, receiver, "actor-0", made), sender(ctx, receiver, "actor-1", made)

    def send(s, actor, version, k=2):
        assert s.send_batch([group(actor, version) for _ in range(k)], timeout_s=2)
        time.sleep(0.1)

    send(a, "actor-0", 0, 4)  # (0 + 1 + 1) × 2: actor-0 at its bound for version 0
    late = threading.Timer(0.5, send, (b, "actor-1", 0))  # actor-1's first call is slow
    late.start()
    batches = [it.collect(version=0, n=4, timeout_s=10)[0]]
    late.join()
    send(a, "actor-0", 1)  # version 1 lets each make 2 more
    send(b, "actor-1", 0)
    send(b, "actor-1", 1)
    batches.append(it.collect(version=1, n=4, timeout_s=10)[0])
    send(a, "actor-0", 2)
    batches.append(it.collect(version=2, n=4, timeout_s=10)[0])
    if paced:
        assert [actors_of(x) for x in batches] == [{"actor-0": 2, "actor-1": 2}] * 3 and not it.dropped
    else:
        assert actors_of(batches[0]) == {"actor-0": 4} and it.dropped["stale"] == 2


def test_groups_held_for_the_next_batch_when_a_checkpoint_is_saved_are_counted_when_that_learner_resumes(learner):
    ctx, receiver, control, make, made = learner
    # no demand: actor-1's groups may arrive a while after actor-0's on a loaded machine, and a demand would take
    # actor-0's surplus into the batch instead of holding it
    it = make("max_staleness=1", demand_after_s=60)
    a, b = sender(ctx, receiver, "actor-0", made), sender(ctx, receiver, "actor-1", made)
    assert a.send_batch([group("actor-0", 0) for _ in range(4)], timeout_s=2)
    assert receiver.sock.poll(5000)  # actor-0's 4 are in before actor-1's 2 (ZeroMQ queues peers fairly, in no set order)
    later = threading.Timer(0.2, lambda: b.send_batch([group("actor-1", 0) for _ in range(2)], timeout_s=2))
    later.start()
    it.collect(version=0, n=4, timeout_s=10)
    later.join()
    assert len(it.held) == 2
    saved = it.state()  # the checkpoint of step 0; the learner is then killed with 2 groups held
    resumed = make("max_staleness=1")
    resumed.restore(saved)
    assert resumed.dropped["held_at_restart"] == 2
    assert resumed.received == resumed.used + sum(resumed.dropped.values())  # balanced again


class Actor(threading.Thread):
    """A throttled actor replayed on live sockets, its Throttle and Inbox kept as actors/main.py keeps them: each
    generate call (`first_s`, then `later_s` seconds) makes its whole budget from the weights it holds, and sends it at
    the end; at budget 0 it waits for the learner's next version, taking a demand for the version it holds meanwhile.
    `calls`: it dies after that many (None: it runs until stopped)."""

    def __init__(self, ctx, receiver, control, made, index: int, first_s: float, later_s: float,
                 calls: int | None = None):
        super().__init__(daemon=True)
        self.name, self.first_s, self.later_s, self.calls = f"actor-{index}", first_s, later_s, calls
        self.inbox = Inbox(ctx, control.sock.getsockopt_string(zmq.LAST_ENDPOINT), self.name, 1 << 20)
        self.sender = sender(ctx, receiver, self.name, made)
        made.append(self.inbox)
        self.throttle = staleness.Throttle(4, 2, index, max_staleness=0)  # on_policy=strict, batches of 4
        self.learner_version, self.stop, self.demands = 0, threading.Event(), []
        self.inbox.request(-1)  # the learner knows it (its notices reach it)

    def run(self):
        calls = 0
        self.throttle.weights(0)
        while not self.stop.is_set() and (self.calls is None or calls < self.calls):
            self.inbox.receive()
            self.throttle.weights(self.learner_version)
            if (budget := self.throttle.budget()) == 0:
                if (demand := self.inbox.take_demand(self.throttle.version)) is not None:
                    self.demands.append(demand)
                    self.throttle.demand(demand.count_for(self.name))
                time.sleep(0.01)
                continue
            time.sleep(self.first_s if calls == 0 else self.later_s)
            calls += 1
            assert self.sender.send_batch([group(self.name, self.throttle.version) for _ in range(budget)], timeout_s=2)
            self.throttle.made(budget)


def run_strict(learner, actors: list[Actor], versions: int) -> tuple[Intake, list]:
    """The learner's side: a batch per version, each version's weights to the actors once its batch is in."""
    ctx, receiver, control, make, made = learner
    it = make("on_policy=strict", demand_after_s=0.6)
    deadline = time.monotonic() + 5
    while len(control.actor_peers) < len(actors) and time.monotonic() < deadline:
        it.wait(100)  # serves the actors' requests
    batches = []
    for a in actors:
        a.start()
    try:
        for version in range(versions):
            batches.append(it.collect(version=version, n=4, timeout_s=20)[0])
            for a in actors:
                a.learner_version = version + 1
    finally:
        for a in actors:
            a.stop.set()
            a.join(10)
    return it, batches


def test_two_strict_actors_whose_generate_calls_are_slower_than_the_gaps_seen_so_far_get_no_demand_and_lose_nothing(
        learner):
    """Issue 46: version 0's groups came together (gaps ~0), so both actors' second calls (2 s) look like silence; a
    demand then made each actor generate the whole missing count again, and in strict mode that surplus went stale.
    While every actor still owes part of its share, no actor is missing."""
    ctx, receiver, control, make, made = learner
    actors = [Actor(ctx, receiver, control, made, i, first_s=0.05, later_s=2.0) for i in range(2)]
    it, batches = run_strict(learner, actors, versions=3)
    assert [actors_of(b) for b in batches] == [{"actor-0": 2, "actor-1": 2}] * 3
    assert it.demands_sent == 0 and not it.dropped and not [a.demands for a in actors if a.demands]


def test_a_strict_actor_that_dies_is_covered_by_the_one_that_delivered_its_share_and_only_by_its_missing_count(
        learner):
    ctx, receiver, control, make, made = learner
    live = Actor(ctx, receiver, control, made, 0, first_s=0.05, later_s=0.2)
    dead = Actor(ctx, receiver, control, made, 1, first_s=0.05, later_s=0.2, calls=1)  # gone after version 0
    it, batches = run_strict(learner, [live, dead], versions=3)
    assert actors_of(batches[0]) == {"actor-0": 2, "actor-1": 2}
    assert [actors_of(b) for b in batches[1:]] == [{"actor-0": 4}] * 2
    assert it.demands_sent == 1 and live.demands[0].counts == {"actor-0": 2}
    assert not it.dropped  # it made the 2 missing groups, not its whole share again
