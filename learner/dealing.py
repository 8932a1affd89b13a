"""The learner's end of `task.epochs`: its dealer answers the actors' PromptsRequests, its intake keeps only the
groups of prompts dealt to their session, and each prompt's final outcome is one line of `<run>/prompts.jsonl`.

A group is known by its session and prompt id (the row's content hash, `DatasetTask.prompt`): the ticket is
the one of that session with that id (the oldest epoch first, where two epochs of one row are out at once).
A session is lost, and what it held dealt again, when its actor asks from a new session (a restart), when the
connection it asked through closes (its process exited or was killed: `learner.connections`, within milliseconds),
or when it has been silent (no request, no group) for half of learner.data_timeout_s with prompts out (a host that
vanished without closing its connections).

The data cursor (`Dealer.cursor`) goes beside each checkpoint as `data_cursor.json`; a resume restores it and cuts
the ledger back to the lines of steps before the checkpoint, so every prompt trained after it is dealt again.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path

from streamrl.config import Config
from streamrl.comm import wire
from streamrl.learner.connections import Connections
from streamrl.tasks.dealer import CURSOR, Dealer, Final, Ticket, cursor_problem, digest

log = logging.getLogger("streamrl.learner")

LEDGER = "prompts.jsonl"


def attach(session, d: "Dealing") -> None:
    """The dealer of a run with task.epochs, wired to the session's control channel and intake."""
    session.dealing = session.intake.dealing = d
    session.control.dealer = d.deal
    d.connections = Connections(session.control.sock)


class Dealing:
    def __init__(self, cfg: Config, task, step: int):
        """step: where the run starts (a resume reads the cursor of checkpoint `step-<step>`)."""
        rows = task.train
        self.ids = [task.prompt(r).id for r in rows]
        # Half the intake's own limit: a dead actor's prompts are dealt again before the learner would give up.
        self.lost_after_s = cfg.learner.data_timeout_s / 2
        self.ledger_path = cfg.run_path / LEDGER
        cursor_file = cfg.run_path / "checkpoints" / f"step-{step}" / CURSOR
        self.data = digest(self.ids)
        if step and cursor_file.is_file():
            cursor = json.loads(cursor_file.read_text())
            # `streamrl run`/`learner` refuse this before anything is written (start.data_cursor_problem); here
            # again for a checkpoint that check could not foresee (a fallback past a damaged newer one)
            if problem := cursor_problem(cursor, len(rows), cfg.seed, cfg.task.epochs, self.data,
                                         f"task.data={cfg.task.data}"):
                raise ValueError(f"learner.resume=true (checkpoint step-{step}): {problem}")
            self.dealer = Dealer.restore(cursor, len(rows), cfg.seed, cfg.task.epochs)
            _cut(self.ledger_path, step)
            log.info("learner: data cursor of step %d: epoch %d at %d of %d, %d prompts to deal again",
                     step, self.dealer.epoch + 1, self.dealer.position, len(rows), len(self.dealer.again))
        else:
            if step:  # a checkpoint of a run without epochs: the epoch starts over, said so
                log.warning("learner: checkpoint step-%d has no %s; the epochs start from the first", step, CURSOR)
            self.dealer = Dealer(len(rows), cfg.task.epochs, cfg.seed)
            _cut(self.ledger_path, 0 if not step else step)
        self.ledger = self.ledger_path.open("a")
        self.learner = uuid.uuid4().hex[:12]  # this start: an actor gives up what an earlier one dealt it
        self.session_of: dict[str, str] = {}  # actor id -> its newest session
        self.seen: dict[str, float] = {}  # session -> when it last asked or sent
        self.claimed: set[Ticket] = set()  # in the batch being collected: trained when its step is
        self.ended = next((e for e in range(self.dealer.epochs) if not self._complete(e)), self.dealer.epochs)
        self.every_epoch, self.eval_owed = cfg.eval.every_epoch, False
        self.step, self.version = step, 0  # the next step to train: an outcome now is of it (the ledger's cut)
        self.connections: Connections | None = None  # the control socket's connections (attach)

    def deal(self, msg: wire.PromptsRequest, frame=None) -> wire.Deal:
        """The control channel's answer to an actor's request (and the outcomes the request carries); `frame`: one
        of the request's frames (the connection it came on)."""
        now = time.monotonic()
        if (old := self.session_of.get(msg.actor_id)) is not None and old != msg.session:
            self._lose(old, "its actor restarted")
        if self.connections is not None:
            # A request that came on a connection closed since was queued before its actor died (or it is
            # reconnecting): nothing is dealt to it, so no prompt goes to the dead; a live actor asks again.
            self.reap()
            if self.connections.came_closed(frame):
                return wire.Deal(rows=[], done=False, learner=self.learner)
            self.connections.saw(frame, msg.session)
        self.session_of[msg.actor_id], self.seen[msg.session] = msg.session, now
        mine = msg.learner == self.learner  # an earlier learner's prompts are not this one's tickets: they are
        for pid in msg.filtered if mine else ():  # dealt again from the checkpoint anyway
            self._outcome(msg.session, pid, "filtered", "removed by a filter on the actor")
        for pid, why in msg.dropped.items() if mine else ():
            self._outcome(msg.session, pid, "dropped", why)
        for session, at in list(self.seen.items()):  # silent sessions holding prompts
            if now - at > self.lost_after_s and session != msg.session:
                self._lose(session, f"silent for {now - at:.0f}s")
        self.ledger.flush()
        rows = self.dealer.deal(msg.session, msg.want)
        return wire.Deal(rows=[tuple(t) for t in rows], done=self.dealer.dealt_out and not rows, learner=self.learner)

    def reap(self) -> list[str]:
        """Deal again the prompts of the sessions whose control connection has closed since the last look (their
        process exited or was killed), at once rather than at the next request; returns those sessions. The learner
        looks on every wait for groups (learner.intake) and on every request (`deal`)."""
        gone = self.connections.closed() if self.connections is not None else []
        for session in gone:
            self._lose(session, "its connection closed: the actor exited or was killed")
        return gone

    def accept(self, group) -> bool:
        """Whether `group` is of a prompt dealt to its session and not yet in this batch; claims it if so."""
        self.seen[group.session] = time.monotonic()
        if group.layer != 1:
            return True
        t = self._ticket(group.session, group.prompt_id)
        if t is None:
            return False
        self.claimed.add(t)
        return True

    def dropped(self, group, reason: str) -> None:
        """The intake dropped `group` (stale, refused, ...): its prompt is dealt again."""
        if group.layer == 1:
            self._outcome(group.session, group.prompt_id, "dropped", reason)

    def trained(self, groups, step: int, version: int, due=None):
        """The batch's groups trained at `step` (with the weights of `version`). Returns `due` (learner.schedule),
        asking for an evaluation (eval.every_epoch) when an epoch has ended by now, at the first step that
        publishes (the actors evaluate a published version)."""
        for g in groups:
            if g.layer == 1 and (t := self._ticket(g.session, g.prompt_id, claimed=True)) is not None:
                self.claimed.discard(t)
                self._write(self.dealer.outcome(g.session, t, "trained"), step, version)
        self.step, self.version = step + 1, version + 1
        self.ledger.flush()
        ended = [e for e in range(self.ended, self.dealer.epochs) if self._complete(e)]
        if ended:
            self.ended = ended[-1] + 1
            log.info("learner: epoch %d ended at step %d: %s", self.ended, step, self.summary()[str(self.ended)])
        self.eval_owed = self.eval_owed or (bool(ended) and self.every_epoch)
        if due is not None and self.eval_owed and due.publish:
            self.eval_owed, due = False, due._replace(evaluate=True)
        return due

    def _complete(self, epoch: int) -> bool:
        c = self.dealer.counts[epoch]
        return c["trained"] + c["filtered"] + c["failed"] == self.dealer.rows

    @property
    def exhausted(self) -> bool:
        """Every prompt of every epoch is dealt, and every one still out is in the batch being collected."""
        return self.dealer.dealt_out and set(self.dealer.out) <= self.claimed

    def save(self, folder: Path) -> None:
        """The cursor beside a checkpoint (its `extra`)."""
        (folder / CURSOR).write_text(json.dumps({**self.dealer.cursor(), "data": self.data}))

    def summary(self) -> dict:
        """summary.json's `epochs`: per epoch, prompts trained, filtered, failed, dealt again."""
        return {str(e + 1): {k: self.dealer.counts[e][k] for k in ("trained", "filtered", "failed", "redealt")}
                for e in range(self.dealer.epochs)}

    def close(self) -> None:
        self.ledger.close()
        if self.connections is not None:
            self.connections.close()

    def _ticket(self, session: str, pid: str, claimed: bool = False) -> Ticket | None:
        held = [t for t, s in self.dealer.out.items() if s == session and self.ids[t.row] == pid
                and (t in self.claimed) == claimed]
        return min(held) if held else None

    def _outcome(self, session: str, pid: str, what: str, reason: str) -> None:
        t = self._ticket(session, pid)
        if t is not None:
            self._write(self.dealer.outcome(session, t, what, reason), self.step, self.version)

    def _lose(self, session: str, why: str) -> None:
        held = sum(s == session for s in self.dealer.out.values())
        for final in self.dealer.lost(session, why, keep=self.claimed):  # those in the batch train with it
            self._write(final, self.step, self.version)
        if held:
            log.info("learner: the prompts of session %s are dealt again (%s)", session, why)
        self.seen.pop(session, None)

    def _write(self, final: Final | None | bool, step: int, version: int) -> None:
        if not final:
            return
        e, row = final.ticket
        line = {"id": self.ids[row], "row": row, "epoch": e + 1, "outcome": final.outcome, "step": step,
                "version": version, "time": round(time.time(), 3),
                **({"reason": final.reason} if final.reason else {})}
        self.ledger.write(json.dumps(line) + "\n")


def _cut(path: Path, step: int) -> None:
    """Keep the ledger's lines of steps before `step` (none for a fresh start): the resume re-deals the rest."""
    if not path.exists():
        return
    kept = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] < step]
    path.write_text("".join(ln + "\n" for ln in kept))
