"""An actor's share of in-training evaluation: the learner's eval requests → the shard's rows sampled on this
actor's own engine at exactly the requested version → scored → an EvalResult back on the group channel.

Sampling and scoring are `streamrl.evaluation`'s (`score_shard`, with the backend's `eval_sampler`), the code
`streamrl eval` runs, so a shard's numbers depend only on the weights and the shard. The actor's loop asks
`run` between generate calls; while it evaluates, it makes no groups (the other actors keep the learner fed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from streamrl import evaluation
from streamrl.actors.weights import ActorWeights
from streamrl.comm import wire
from streamrl.comm.control import Inbox
from streamrl.comm.groups import GroupSender
from streamrl.config import Config

log = logging.getLogger("streamrl.actor")


class ActorEvals:
    def __init__(self, cfg: Config, actor_id: str, backend, tokenizer, reward, weights: ActorWeights,
                 sender: GroupSender, inbox: Inbox):
        self.cfg, self.actor_id, self.reward, self.tokenizer = cfg, actor_id, reward, tokenizer
        self.backend, self.weights, self.sender, self.inbox = backend, weights, sender, inbox
        self._sets: dict[str, evaluation.EvalSet] | None = None  # read at the first request
        self.shards = 0
        self.seconds = 0.0

    def sets(self) -> dict[str, evaluation.EvalSet]:
        if self._sets is None:
            self._sets = {es.name: es for es in evaluation.eval_sets(self.cfg, self.reward.task)}
        return self._sets

    def run(self, stop: Callable[[], bool]) -> int:
        """Answer every eval request waiting; returns how many shards were evaluated."""
        done = 0
        while (req := self.inbox.take_eval()) is not None and not stop():
            try:
                result = self.evaluate(req, stop)
            except (ValueError, OSError, RuntimeError) as e:  # an eval file missing here, an engine refusing: the
                log.exception("%s: evaluation of version %d failed", self.actor_id, req.version)  # learner asks another
                result = wire.EvalResult(actor_id=self.actor_id, version=req.version, set=req.set, start=req.start,
                                         stop=req.stop, rewards=[], error=f"{type(e).__name__}: {e}"[:500])
            if not self.sender.notice(result, self.cfg.actors.send_timeout_s):
                log.warning("%s: the learner took no eval result for %.0fs; dropped", self.actor_id,
                            self.cfg.actors.send_timeout_s)
            done += not result.error
        return done

    def evaluate(self, req: wire.EvalRequest, stop: Callable[[], bool]) -> wire.EvalResult:
        """The result of one request (an error result when the set or the version cannot be had)."""
        t0 = time.perf_counter()
        answer = dict(actor_id=self.actor_id, version=req.version, set=req.set, start=req.start, stop=req.stop)
        es = self.sets().get(req.set)
        if es is None or req.stop > len(es.prompts) or req.start >= req.stop:
            return wire.EvalResult(**answer, rewards=[], error=f"no rows [{req.start}, {req.stop}) in eval set "
                                   f"{req.set!r} here (sets: {sorted(self.sets())}); are the configs the same?")
        if not self.weights.hold(req.version, stop):
            return wire.EvalResult(**answer, rewards=[], error=f"version {req.version} is gone here (holding "
                                   f"{self.weights.version})")
        log.info("%s: evaluating version %d, set %r rows [%d, %d)", self.actor_id, req.version, req.set or "eval",
                 req.start, req.stop)
        sample = self.backend.eval_sampler(self.cfg.eval.temperature, self.tokenizer)
        scores = evaluation.score_shard(sample, self.tokenizer, self.reward, es.prompts[req.start:req.stop],
                                        self.cfg, req.seed)
        self.shards += 1
        self.seconds += (eval_s := time.perf_counter() - t0)
        return wire.EvalResult(**answer, rewards=scores.rewards, unparseable=scores.unparseable,
                               corrected=scores.corrected, eval_s=eval_s)

    def report(self) -> dict:
        return {"eval_shards": self.shards, "eval_s": round(self.seconds, 3)} if self.shards else {}
