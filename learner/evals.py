"""In-training evaluation, the learner's side: ask actors to evaluate a version, collect their answers, record.

Every `eval.every` steps the learner asks for an evaluation of the version it just published: each eval set is
cut into `eval.actors` shards (`streamrl.evaluation.shards`), and each shard goes as an EvalRequest to one live
actor (round after round the shards rotate over the actors). The learner never waits for them: actors answer
with EvalResults on the group channel, the intake keeps them aside, and `take` (once per step) reads them. A
shard not answered within `eval.timeout_s`, or whose actor exited, errs or sent a malformed answer, is asked of
another actor (`eval_reissued`). Once every shard of a version is in, its eval/* figures (`set_metrics`, the
code `streamrl eval` runs) go into the next step's metrics.jsonl record, tagged `eval_version`, `eval_step` and
`eval_actors` (shards per actor), into Prometheus, and one line per evaluation into evals.jsonl. A step after
which every step left owes a record to an evaluation waits for the oldest one out (at most eval.timeout_s), so a
run's final evaluation is never lost, nor one that was slower than eval.every steps.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable

from streamrl import evaluation
from streamrl.comm import wire
from streamrl.comm.control import ControlServer
from streamrl.comm.groups import GroupReceiver
from streamrl.config import Config
from streamrl.run import jsonfiles

log = logging.getLogger("streamrl.learner")
MAX_ATTEMPTS = 4  # re-issues of one shard before its evaluation is given up (each after an error or eval.timeout_s)


@dataclasses.dataclass
class _Ask:
    actor: str | None
    sent_at: float
    attempt: int = 0


@dataclasses.dataclass
class _Round:
    """One evaluation: version `version`, made by step `step` (0-based)."""

    step: int
    version: int
    started: float
    asks: dict[evaluation.Shard, _Ask]
    scores: dict[evaluation.Shard, evaluation.ShardScores] = dataclasses.field(default_factory=dict)
    actors: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    eval_s: float = 0.0
    reissued: int = 0


class Evals:
    def __init__(self, cfg: Config, task, control: ControlServer, receiver: GroupReceiver, telemetry,
                 dropped: collections.Counter, clock: Callable[[], float] = time.monotonic,
                 wait: Callable[[int], object] | None = None):
        """dropped: the intake's count of dropped groups (groups that arrive while the last step waits go there).
        wait(timeout_ms): the session's poller, which serves control requests (default: the group socket, then
        the requests)."""
        self.cfg, self.control, self.receiver, self.telemetry, self.clock = cfg, control, receiver, telemetry, clock
        self.wait = wait or (lambda timeout_ms: (receiver.sock.poll(timeout_ms), control.serve()))
        self.dropped = dropped
        self.requested = 0
        self.sets = evaluation.eval_sets(cfg, task) if cfg.eval.every or cfg.eval.every_epoch else []
        self.plan = evaluation.shards(self.sets, cfg.eval.actors)
        self.rounds: dict[int, _Round] = {}
        self.ready: list[dict] = []
        self.ignored: collections.Counter[str] = collections.Counter()
        """Eval results not used, by why (late: its evaluation was already complete or abandoned)."""
        self.path = cfg.run_path / "evals.jsonl"

    def request(self, step: int, version: int) -> None:
        """Ask for an evaluation of `version` (just published by step `step`)."""
        now = self.clock()
        r = self.rounds[version] = _Round(step, version, now, {sh: _Ask(None, now) for sh in self.plan})
        live = self._live()
        for i, shard in enumerate(self.plan):  # shard i of every set to the same actor; rounds rotate the actors
            slot = (i % self.cfg.eval.actors + self.requested) % len(live) if live else 0
            self._ask(r, shard, live[slot:] + live[:slot])
        self.requested += 1

    def owed(self, step: int, steps: int) -> int:
        """Evaluations that still need a metrics record after step `step` (0-based) was taken: those ready, those
        out, and those the steps after it will ask for."""
        every = self.cfg.eval.every
        later = sum(1 for done in range(step + 2, steps + 1) if every and done % every == 0)
        return len(self.ready) + len(self.rounds) + later

    def take(self, wait: bool = False, stop: Callable[[], bool] = lambda: False, last: bool = True) -> dict:
        """The oldest evaluation completed since the last call (eval/* and its tags), or {}. wait: first wait, at
        most eval.timeout_s, until one is complete (when every step left has an evaluation owed to it: the run's
        last step, or one before it while evaluations slower than eval.every steps pile up, so each evaluation
        gets its step's record; the run's last one is never lost). Groups read meanwhile (the answers queue behind
        them) are dropped as lost_at_shutdown after the `last` step, else handed back for the next batch."""
        self.poll()
        deadline = self.clock() + self.cfg.eval.timeout_s
        held = []
        while wait and self.rounds and not self.ready and self.clock() < deadline and not stop():
            self.wait(50)
            if (group := self.receiver.take()) is not None:
                if last:  # the run has its steps: a group arriving now is not trained on
                    self.dropped["lost_at_shutdown"] += 1
                else:
                    held.append(group)
            self.poll()
        self.receiver.hand_back(held)
        if wait and self.rounds and not self.ready:
            log.warning("evaluation of version(s) %s not complete after %.0fs (eval.timeout_s); %s",
                        sorted(self.rounds), self.cfg.eval.timeout_s,
                        "not recorded" if last else "training goes on, and it is recorded if it comes")
        return self.ready.pop(0) if self.ready else {}

    def poll(self) -> None:
        """Take the answers that arrived; ask again where one is overdue or its actor is gone."""
        while self.receiver.eval_results:
            self._answer(self.receiver.eval_results.popleft())
        now, gone = self.clock(), self._exited()
        for r in list(self.rounds.values()):
            for shard, ask in list(r.asks.items()):
                if r.version in self.rounds and shard not in r.scores and (ask.actor is None or ask.actor in gone
                                              or now - ask.sent_at > self.cfg.eval.timeout_s):
                    self._again(r, shard, why="no actor" if ask.actor is None else
                                "its actor exited" if ask.actor in gone else "no answer in eval.timeout_s")

    def _answer(self, res: wire.EvalResult) -> None:
        r, shard = self.rounds.get(res.version), evaluation.Shard(res.set, res.start, res.stop)
        if r is None or shard not in r.asks or shard in r.scores:
            self.ignored["late"] += 1
            return
        try:
            res.check(self.cfg.eval.samples)
        except wire.WireError as e:
            self.ignored[e.reason] += 1
            return self._again(r, shard, why=f"{res.actor_id} sent a malformed result ({e})", avoid=res.actor_id)
        if res.error:
            self.ignored["actor_error"] += 1
            return self._again(r, shard, why=f"{res.actor_id}: {res.error}", avoid=res.actor_id)
        r.scores[shard] = evaluation.ShardScores(res.rewards, res.unparseable, res.corrected)
        r.actors[res.actor_id] += 1
        r.eval_s += res.eval_s
        if len(r.scores) == len(r.asks):
            del self.rounds[r.version]
            self._record(r)

    def _again(self, r: _Round, shard: evaluation.Shard, why: str, avoid: str | None = None) -> None:
        if r.asks[shard].attempt >= MAX_ATTEMPTS:
            log.error("eval of version %d abandoned: set %r rows [%d, %d) failed %d times (last: %s)", r.version,
                      shard.set or "eval", shard.start, shard.stop, MAX_ATTEMPTS + 1, why)
            self.ignored["abandoned"] += 1
            del self.rounds[r.version]
            return
        avoid = avoid or r.asks[shard].actor
        live = self._live()
        others = [a for a in live if a != avoid] or live
        if r.asks[shard].actor is not None:
            r.reissued += 1
            log.warning("eval of version %d, set %r rows [%d, %d): %s; asking %s", r.version, shard.set or "eval",
                        shard.start, shard.stop, why, others[0] if others else "the next actor that joins")
        self._ask(r, shard, others, attempt=r.asks[shard].attempt + (r.asks[shard].actor is not None))

    def _ask(self, r: _Round, shard: evaluation.Shard, candidates: list[str], attempt: int = 0) -> None:
        req = wire.EvalRequest(version=r.version, set=shard.set, start=shard.start, stop=shard.stop,
                               seed=evaluation.shard_seed(self.cfg.eval.seed, shard), attempt=attempt)
        actor = next((a for a in candidates if self.control.send_to(a, req)), None)
        r.asks[shard] = _Ask(actor, self.clock(), attempt)

    def _live(self) -> list[str]:
        """Actors that sent groups this life and have not reported their end (the ones that can take a request)."""
        gone = self._exited()
        sessions = self.receiver.sessions
        live = {a for (a, _), c in sessions.items() if c.received and c.report is None} - gone
        return sorted(live - set(self.control.refused_actors))

    def _exited(self) -> set[str]:
        """Actors whose newest session reported its end."""
        newest: dict[str, object] = {}
        for (actor, _), count in self.receiver.sessions.items():  # insertion order: a restart's session comes later
            newest[actor] = count
        return {a for a, c in newest.items() if c.report is not None}

    def _record(self, r: _Round) -> None:
        rec: dict = {}
        for es in self.sets:
            rec.update(evaluation.set_metrics(self.cfg, es, [r.scores[sh] for sh in self.plan if sh.set == es.name]))
        rec.update({"eval/samples": self.cfg.eval.samples, "eval_version": r.version, "eval_step": r.step,
                    "eval_actors": dict(r.actors), "eval_s": r.eval_s, "eval_wall_s": self.clock() - r.started,
                    "eval_reissued": r.reissued, "eval_results_ignored": dict(self.ignored)})
        with open(self.path, "a") as f:
            f.write(jsonfiles.line(rec))
        self.telemetry.observe_eval(rec)
        self.ready.append(rec)
        log.info("eval of version %d (step %d) by %s in %.2fs", r.version, r.step, dict(r.actors), rec["eval_wall_s"])
