"""An actor's dealt prompts: asked for ahead, made from the dealt rows, and what made no group reported back."""

from __future__ import annotations

import collections
from types import SimpleNamespace as NS

from streamrl.actors.dealt import DealtPrompts
from streamrl.comm import wire


class Inbox:
    """The control channel's actor end, answered at once by a dealer of rows 0, 1, 2, ..."""

    def __init__(self, rows: int, learner: str = "L1"):
        self.deals, self.asked, self.shutdown = collections.deque(), [], None
        self.next, self.rows, self.learner = 0, rows, learner

    def receive(self) -> None:
        pass

    def ask_prompts(self, msg: wire.PromptsRequest) -> bool:
        self.asked.append(msg)
        got = list(range(self.next, min(self.rows, self.next + msg.want)))
        self.next += len(got)
        self.deals.append(wire.Deal(rows=[(0, r) for r in got], done=not got, learner=self.learner))
        return True


class Task:
    train = [f"r{i}" for i in range(100)]

    @staticmethod
    def prompt(row):
        return NS(id=f"id-{row}")


def test_prompts_come_from_the_dealt_rows_with_a_call_more_asked_ahead():
    inbox = Inbox(100)
    d = DealtPrompts(inbox, Task, "actor-0", "s", ahead=4)
    assert [p.id for p in d.take(4)] == ["id-r0", "id-r1", "id-r2", "id-r3"]
    assert inbox.asked[0].want == 8 and len(d.hand) == 4  # the next call's are in hand already


def test_a_prompt_without_a_group_is_reported_filtered_or_dropped_with_the_next_request():
    inbox = Inbox(100)
    d = DealtPrompts(inbox, Task, "actor-0", "s", ahead=0)
    prompts = d.take(3)
    sent = [NS(prompt_id="id-r0", layer=1)]
    d.settle(prompts, sent, {"id-r0": [1.0, 0.0], "id-r1": [1.0, 1.0]}, filter_on=True)  # r2 was never scored
    d.asked_at = None  # the previous request was answered
    d.take(1)
    assert inbox.asked[-1].filtered == ["id-r1"] and inbox.asked[-1].dropped == {"id-r2": "unscored"}


def test_once_dealt_out_an_actor_asks_only_now_and_then_and_takes_what_comes_back():
    inbox = Inbox(2)
    d = DealtPrompts(inbox, Task, "actor-0", "s", ahead=0)
    assert len(d.take(2)) == 2
    d.asked_at = None
    assert d.take(2) == [] and d.done
    asked = len(inbox.asked)
    assert d.take(2) == [] and len(inbox.asked) == asked  # not at once: every ASK_AGAIN_S (a lost actor's re-dealt)
    inbox.rows, d.answered_at = 3, d.answered_at - 60  # later, a row a dead actor held comes back
    assert d.take(2) == [] and len(inbox.asked) == asked + 1  # asked again; the answer is taken at the next call
    assert [p.id for p in d.take(2)] == ["id-r2"] and not d.done


def test_a_restarted_learner_s_deal_replaces_the_hand_an_earlier_one_dealt():
    inbox = Inbox(100)
    d = DealtPrompts(inbox, Task, "actor-0", "s", ahead=4)
    d.take(2)
    assert len(d.hand) == 4
    inbox.deals.append(wire.Deal(rows=[(0, 50), (0, 51)], learner="L2"))  # a restarted learner's deal arrives
    assert [p.id for p in d.take(2)] == ["id-r50", "id-r51"]  # r2..r5, dealt by the learner before, are given up


def test_a_call_over_prompts_an_earlier_learner_dealt_sends_nothing():
    inbox = Inbox(100)
    d = DealtPrompts(inbox, Task, "actor-0", "s", ahead=0)
    prompts = d.take(2)
    inbox.deals.append(wire.Deal(rows=[(0, 50)], learner="L2"))  # the learner restarted while the call generated
    d.take(0)
    assert d.settle(prompts, [NS(prompt_id=p.id, layer=1) for p in prompts], {}, filter_on=False) == []
    assert not d.dropped  # nothing reported: the new learner deals them again from its checkpoint
