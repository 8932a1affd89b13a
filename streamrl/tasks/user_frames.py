"""A failure of the user's code as its author wants to read it: the traceback from the first frame that is not
streamrl's (a reward function, an environment's `step`, a tool, an agent, a verifiers environment), without the
frames of streamrl, the thread pool, the thread or the event loop that called it.

One rule for every path that shows a user's failure (the failure window's first traceback, on the terminal and in
`summary.json`), so the docs' "your own frames" holds for each. A failure raised inside streamrl alone (a check of
what the user's code returned) keeps its whole traceback: there is no frame of the user's to start from.
"""

from __future__ import annotations

import traceback
from types import FrameType

RUNNERS = ("streamrl", "concurrent", "threading", "asyncio")
"""Top-level packages whose frames only run the user's code: streamrl's own (its processes install as
streamrl.actors and streamrl.learner), the thread pool, threads and event loops."""


def _runs_it(frame: FrameType) -> bool:
    return str(frame.f_globals.get("__name__", "")).split(".", 1)[0] in RUNNERS


def user_traceback(err: BaseException) -> str:
    """err's traceback from its first frame outside `RUNNERS` down (the whole one when it has no such frame)."""
    tb = err.__traceback__
    while tb is not None and _runs_it(tb.tb_frame):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(err), err, tb if tb is not None else err.__traceback__))
