"""A data row that lacks what the user's code reads is bad data, not the model's mistake.

An environment, agent or SkyRL-Gym env gets its row as a `WatchedRow`: a dict that remembers each key read from it
that it lacks, and each index read past the end of one of its list columns (`row["choices"][3]` of a row with three).
When the user's code then fails with that KeyError or IndexError, the failure is the row's (`data_error`): its
episodes are excluded from training (the group is not sent), they never count against the code's failure window
(the code is not broken, the row is), and `BadRows` counts them by reason (`reward_failures/bad_data`, in samples),
names each bad row once on the terminal by its file and line (`data/train.jsonl:17`), and keeps the first few for
the actor's report. Rows bad on most of a window of episodes stop the run as a broken function does: a column name
wrong in the config or the data, with nothing left to train on.
"""

from __future__ import annotations

import collections
import logging

from streamrl.tasks.reward_health import FailureWindow

log = logging.getLogger("streamrl.tasks")
SHOWN = 20
"""Bad rows the actor's report lists (each named on the terminal once); the rest are counted."""


class WatchedRow(dict):
    """A data row as the user's code reads it; `missing`: keys read from it that it lacks (each a KeyError raised
    to the reader), shared by the rows derived from it; `where`: its file and line (else its prompt id)."""

    def __init__(self, items, where: str, missing: list | None = None):
        super().__init__(items)
        self.where = where
        self.missing: list = [] if missing is None else missing

    def __missing__(self, key):
        self.missing.append(key)
        raise KeyError(key)

    def __getitem__(self, key):
        value = super().__getitem__(key)
        if type(value) is list:  # watched from its first read on, in place: the reader's changes stay in the row
            value = WatchedList(value, key, self.missing)
            super().__setitem__(key, value)
        return value

    def derived(self, items) -> "WatchedRow":
        """A new row from `items` (an adapter's view of this one) whose missing keys count as this row's."""
        return WatchedRow(items, self.where, self.missing)


class WatchedList(list):
    """A list column of a WatchedRow (`column`): an index read past its end notes the IndexError itself in the row's
    `missing` (the very exception, so one the reader caught and handled is never taken for a later failure)."""

    def __init__(self, items, column, missing: list):
        super().__init__(items)
        self.column, self.missing = column, missing

    def __getitem__(self, index):
        try:
            return super().__getitem__(index)
        except IndexError as e:
            e.add_note(f"column {self.column!r} has {len(self)} item(s); index {index} was read")
            self.missing.append(e)
            raise


def data_error(row, err: BaseException | None) -> str | None:
    """Why `err`, raised by the user's code reading `row`, is the row's fault ("missing column 'answer'"), or None
    (the code's own failure). Follows the exception's causes: an adapter may wrap the reader's KeyError."""
    if not isinstance(row, WatchedRow) or not row.missing:
        return None
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyError) and err.args and any(err.args[0] == m for m in row.missing
                                                          if not isinstance(m, BaseException)):
            return f"missing column {err.args[0]!r}"
        if isinstance(err, IndexError) and any(err is m for m in row.missing):
            return err.__notes__[-1]  # "column 'choices' has 3 item(s); index 3 was read"
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


class BadRows:
    """The rows found bad by one actor: reason → episodes, the first SHOWN rows (where → reason), and the window
    that stops the run when most recent episodes were bad. `source`: what the rows come from (task.data)."""

    def __init__(self, source: str, window: int, threshold: float):
        self.source = source
        self.counts: collections.Counter = collections.Counter()
        self.rows: dict[str, str] = {}
        self._named: set[str] = set()
        self.health = FailureWindow(window, threshold, kind="data")

    def bad(self, row: WatchedRow, reason: str, reader: str) -> None:
        """An episode of `row` failed because of it (`reason`, from data_error); `reader`: whose code read it."""
        self.counts[reason] += 1
        if row.where not in self._named:
            self._named.add(row.where)
            if len(self.rows) < SHOWN:
                self.rows[row.where] = reason
            log.warning("bad data: %s: %s (read by %s; the row has %s): its episodes are not trained on, counted "
                        "as bad_data", row.where, reason, reader, ", ".join(map(str, row)) or "nothing")
        self.health.note(self.source, "bad_data", f"{row.where}: {reason} (read by {reader})")
        self.health.record(self.source, "bad_data", self.counts)

    def good(self) -> None:
        """An episode its row served to the end (whatever the model did)."""
        self.health.record(self.source, None, self.counts)

    def report(self) -> dict:
        """For the actor's report: {"bad_rows": {where: reason}} for the first SHOWN rows ({} without any)."""
        return {"bad_rows": dict(self.rows)} if self.rows else {}
