"""The dealer: which prompt of which epoch each actor generates next, so every prompt of every epoch is trained
once (`task.epochs` with a dealer; the learner owns it, actors ask it over the control channel).

A prompt is a `Ticket` (epoch, row). `deal(session, k)` hands a session up to k tickets: first those to deal
again, then the next of the epoch's seeded order (`epochs.order`), moving into the next epoch when one is
dealt out; after the last epoch it hands nothing. Each ticket dealt ends in one final outcome, given by
`outcome(session, ticket, what)`:
- "trained" (its group went into a step), "filtered" (a filter removed it: recorded, not replaced) or
  "failed" (it cannot be trained; a reason is kept) are final;
- "dropped" (stale, refused, rejected, unscorable) puts it back to be dealt again, up to `max_deals` deals
  (then it fails, "dealt N times"), and so does `lost(session)` for every ticket a dead session held.
An outcome counts only from the session the ticket is dealt to now: a group of a session declared lost that
arrives after all, once its prompt has been dealt again, is refused (the caller drops it) so nothing trains twice.

`cursor()` is what a checkpoint keeps (the epoch, the position in its order, every ticket out or waiting to be
dealt again); `Dealer.restore` continues from it, dealing all of those again first: a ticket that was trained
after the checkpoint was trained into weights the resume throws away.
"""

from __future__ import annotations

import collections
import hashlib
from typing import NamedTuple

from streamrl.tasks import epochs as epochs_lib

CURSOR = "data_cursor.json"  # a checkpoint's data cursor (`Dealer.cursor`, with the rows' `digest`)
FINAL = ("trained", "filtered", "failed")
OUTCOMES = (*FINAL, "dropped")


class Ticket(NamedTuple):
    epoch: int
    row: int


class Final(NamedTuple):
    """A ticket's one final outcome (one line of the run's prompts ledger)."""

    ticket: Ticket
    outcome: str
    reason: str


def digest(ids: list[str]) -> str:
    """The rows a cursor is dealt from, in file order (`ids`: each row's prompt id, its content hash)."""
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]


def cursor_problem(cursor: dict, rows: int, seed: int, epochs: int, data: str | None = None,
                   source: str = "the data") -> str | None:
    """Why a checkpoint's data cursor cannot go on with these rows (their `digest`, read from `source`; None: not
    compared), seed and epochs, in one line; None when it can. The learner's resume and the check before anything
    starts both ask."""
    if data is not None and cursor.get("data", data) != data:
        return (f"{source} holds other rows than the checkpoint's data cursor was dealt from (data {cursor['data']}, "
                f"now {data}): resuming would deal other prompts than the epoch's (restore the run's data, or start "
                "a new run)")
    for key, now in (("rows", rows), ("seed", seed)):
        if cursor[key] != now:
            return (f"the checkpoint's data cursor was made with {key}={cursor[key]}, this run has {key}={now}: "
                    "resuming would deal other prompts than the epoch's (keep the data and seed of the run, or start "
                    "a new run)")
    if epochs <= cursor["epoch"]:
        return f"task.epochs={epochs}: the checkpoint is already in epoch {cursor['epoch'] + 1}"
    return None


class Dealer:
    def __init__(self, rows: int, epochs: int, seed: int, max_deals: int = 8):
        if epochs < 1:
            raise ValueError(f"the dealer needs task.epochs >= 1, got {epochs}")
        self.rows, self.epochs, self.seed, self.max_deals = rows, epochs, seed, max_deals
        self.epoch, self.position = 0, 0
        self._order = epochs_lib.order(rows, seed, 0)
        self.again: collections.deque[Ticket] = collections.deque()  # to be dealt before the order goes on
        self.out: dict[Ticket, str] = {}  # ticket -> the session it is dealt to now
        self.deals: collections.Counter[Ticket] = collections.Counter()  # times each unfinished ticket was dealt
        self.counts: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
        """Per epoch: trained, filtered, failed, redealt (deals after the first), refused (late outcomes)."""

    def deal(self, session: str, k: int) -> list[Ticket]:
        """Up to k tickets for `session` (fewer, or none, once the last epoch is dealt out)."""
        got: list[Ticket] = []
        while len(got) < k:
            if self.again:
                t = self.again.popleft()
                self.counts[t.epoch]["redealt"] += 1
            elif self.position < self.rows:
                t = Ticket(self.epoch, self._order[self.position])
                self.position += 1
            elif self.epoch + 1 < self.epochs:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = epochs_lib.order(self.rows, self.seed, self.epoch)
                continue
            else:
                break
            self.out[t] = session
            self.deals[t] += 1
            got.append(t)
        return got

    def outcome(self, session: str, ticket: Ticket, what: str, reason: str = "") -> Final | None | bool:
        """Record what became of `ticket`'s group from `session`: the Final for a final outcome, None for a drop
        (dealt again, or failed past max_deals: then its Final), False when `session` does not hold the ticket
        (a late group: the caller must not train it)."""
        if what not in OUTCOMES:
            raise ValueError(f"outcome {what!r}; allowed: {', '.join(OUTCOMES)}")
        if self.out.get(ticket) != session:
            self.counts[ticket.epoch]["refused"] += 1
            return False
        del self.out[ticket]
        if what == "dropped":
            return self._again(ticket, reason)
        return self._final(ticket, what, reason)

    def lost(self, session: str, why: str = "its actor was lost", keep=frozenset()) -> list[Final]:
        """Every ticket `session` held, but those in `keep` (already on their way into a step), goes to be dealt
        again (those past max_deals fail: their Finals)."""
        held = [t for t, s in self.out.items() if s == session and t not in keep]
        failed = []
        for t in held:
            del self.out[t]
            if (f := self._again(t, why)) is not None:
                failed.append(f)
        return failed

    def _again(self, ticket: Ticket, reason: str) -> Final | None:
        if self.deals[ticket] >= self.max_deals:
            return self._final(ticket, "failed", f"dealt {self.deals[ticket]} times, never trained (last: {reason})")
        self.again.append(ticket)
        return None

    def _final(self, ticket: Ticket, what: str, reason: str) -> Final:
        self.deals.pop(ticket, None)
        self.counts[ticket.epoch][what] += 1
        return Final(ticket, what, reason)

    @property
    def dealt_out(self) -> bool:
        """Nothing left to deal: every epoch's order is dealt and nothing waits to be dealt again."""
        return not self.again and self.position >= self.rows and self.epoch + 1 >= self.epochs

    @property
    def finished(self) -> bool:
        """Every ticket of every epoch has its final outcome."""
        return self.dealt_out and not self.out

    def cursor(self) -> dict:
        """What a checkpoint keeps (JSON): where the order stands and every ticket without a final outcome."""
        return {"rows": self.rows, "epochs": self.epochs, "seed": self.seed, "epoch": self.epoch,
                "position": self.position, "pending": [list(t) for t in [*self.again, *self.out]],
                "deals": [[*t, n] for t, n in self.deals.items()],
                "counts": {str(e): dict(c) for e, c in self.counts.items()}}

    @classmethod
    def restore(cls, cursor: dict, rows: int, seed: int, epochs: int, max_deals: int = 8) -> "Dealer":
        """Continue from a checkpoint's cursor: its pending tickets are dealt again first. A cursor of other data
        (row count) or another seed is refused by name; more epochs than before are allowed (fewer: not below
        the one it is in)."""
        if problem := cursor_problem(cursor, rows, seed, epochs):
            raise ValueError(problem)
        d = cls(rows, epochs, seed, max_deals)
        d.epoch, d.position = cursor["epoch"], cursor["position"]
        d._order = epochs_lib.order(rows, seed, d.epoch)
        d.again.extend(Ticket(*t) for t in cursor["pending"])
        d.deals.update({Ticket(e, r): n for e, r, n in cursor["deals"]})
        for e, c in cursor["counts"].items():
            d.counts[int(e)].update(c)
        return d
