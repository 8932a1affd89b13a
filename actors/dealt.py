"""An actor's prompts under `task.epochs`: dealt by the learner (`streamrl.tasks.dealer`), never drawn here.

The actor keeps one PromptsRequest out ahead of its need, so a deal is usually waiting when a generate call
starts; it blocks only with nothing dealt in hand. Each request also says what became of the prompts dealt
before that made no group: removed by a filter (`filtered`: recorded by the learner, not dealt again) or lost
for another reason (`dropped`: unscorable, too long; dealt again). Once the learner says every epoch is dealt
out the actor idles until the learner's shutdown, asking every `ASK_AGAIN_S` in case prompts a lost actor held
are dealt again.
"""

from __future__ import annotations

import collections
import logging
import time

from streamrl.comm import wire
from streamrl.comm.control import Inbox

log = logging.getLogger("streamrl.actor")

ASK_AGAIN_S = 2.0  # a request unanswered this long is sent again (the learner may have restarted)


class DealtPrompts:
    def __init__(self, inbox: Inbox, task, actor_id: str, session: str, ahead: int, stop=lambda: False):
        """ahead: prompts to hold in hand beyond the current call's (one generate call's worth); stop(): the actor
        is stopping (asked while waiting for a deal, so a signal still ends it)."""
        self.inbox, self.task, self.actor_id, self.session, self.ahead = inbox, task, actor_id, session, ahead
        self.stop = stop
        self.learner: str | None = None  # the learner start that dealt what is in hand
        self.taken_from: str | None = None  # ... and the one that dealt the current call's prompts
        self.hand: collections.deque = collections.deque()
        self.asked_at: float | None = None  # when the request still unanswered went
        self.answered_at: float | None = None  # when the last deal came
        self.done = False
        self.filtered: list[str] = []
        self.dropped: dict[str, str] = {}
        self.dealt = 0
        self.wait_s = 0.0  # blocked with nothing in hand, waiting for a deal (the dealer's cost to this actor)

    def take(self, k: int) -> list:
        """Up to k dealt prompts (waits for a deal with none in hand; [] once every epoch is dealt out)."""
        t0 = time.perf_counter()
        while True:
            self._receive()
            if len(self.hand) < k + self.ahead:  # dealt out: still asked now and then (a dead actor's are re-dealt)
                self._ask(k + self.ahead - len(self.hand))
            if self.hand or self.done or self.stop() or self.inbox.shutdown is not None:
                break
            time.sleep(0.005)
        self.wait_s += time.perf_counter() - t0
        if not self.hand and self.done:
            time.sleep(0.1)  # dealt out: the learner's shutdown comes next
        got = [self.hand.popleft() for _ in range(min(k, len(self.hand)))]
        if got:
            self.taken_from = self.learner
        return got

    def settle(self, prompts: list, groups: list, observed: dict[str, list[float]], filter_on: bool) -> list:
        """After a generate call over `prompts`: those with no layer-1 group in `groups` are reported with the next
        request, as filtered (their rewards were observed, all equal, under the zero-variance filter) or dropped.
        Returns the groups to send: none when a restarted learner has dealt since the call's prompts were taken
        (it deals them again; sent, one could stand in for its own deal's copy, which would then be made in vain)."""
        if self.taken_from != self.learner:
            log.info("%s: %d groups of prompts an earlier learner dealt not sent", self.actor_id, len(groups))
            return []
        made = collections.Counter(g.prompt_id for g in groups if g.layer == 1)
        for p in prompts:
            if made[p.id]:
                made[p.id] -= 1
                continue
            rewards = observed.get(p.id)
            if filter_on and rewards is not None and len(set(rewards)) <= 1:
                self.filtered.append(p.id)
            else:
                self.dropped[p.id] = "unscored" if rewards is None else "no group"
        return groups

    def _receive(self) -> None:
        self.inbox.receive()
        while self.inbox.deals:
            deal = self.inbox.deals.popleft()
            self.answered_at = time.monotonic()
            if deal.learner != self.learner:  # a restarted learner re-deals from its checkpoint: the old hand goes
                if self.learner is not None:
                    log.info("%s: the learner restarted; %d dealt prompts in hand given up", self.actor_id,
                             len(self.hand))
                    self.hand.clear()
                    self.done, self.filtered, self.dropped = False, [], {}
                self.learner = deal.learner
            self.asked_at = None
            self.done = deal.done and not deal.rows
            self.dealt += len(deal.rows)
            self.hand.extend(self.task.prompt(self.task.train[row]) for _, row in deal.rows)

    def _ask(self, want: int) -> None:
        if self.asked_at is not None and time.monotonic() - self.asked_at < ASK_AGAIN_S:
            return
        if self.done and self.answered_at is not None and time.monotonic() - self.answered_at < ASK_AGAIN_S:
            return
        msg = wire.PromptsRequest(actor_id=self.actor_id, session=self.session, want=want,
                                  filtered=self.filtered, dropped=self.dropped, learner=self.learner or "")
        if self.inbox.ask_prompts(msg):
            self.asked_at = time.monotonic()
            self.filtered, self.dropped = [], {}
