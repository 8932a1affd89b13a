"""What makes a failure the row's and not the code's (streamrl.tasks.data_errors): a key the row lacks, an index past
the end of one of its list columns; a lookup the reader caught, or an error of the code's own, never counts."""

from __future__ import annotations

import pytest

from streamrl.tasks.data_errors import WatchedRow, data_error


def _raised(fn) -> BaseException:
    with pytest.raises((KeyError, IndexError)) as got:
        fn()
    return got.value


def test_an_index_past_the_end_of_a_list_column_is_the_rows_fault_naming_the_column_and_its_length():
    row = WatchedRow({"choices": ["a", "b", "c"], "question": "q"}, "data/train.jsonl:7")
    err = _raised(lambda: row["choices"][3])
    assert data_error(row, err) == "column 'choices' has 3 item(s); index 3 was read"
    # read through a derived row (an adapter's view), noted on the row it came from
    view = row.derived({"options": row["choices"]})
    assert data_error(row, _raised(lambda: view["options"][5])) == "column 'choices' has 3 item(s); index 5 was read"


def test_an_index_error_of_the_codes_own_or_one_it_caught_is_not_the_rows():
    row = WatchedRow({"choices": ["a"]}, "x")
    try:
        row["choices"][2]  # the reader's own fallback handles it
    except IndexError:
        pass
    assert data_error(row, _raised(lambda: [][0])) is None
    assert data_error(WatchedRow({"choices": []}, "x"), _raised(lambda: [][0])) is None


def test_a_watched_list_column_stays_the_rows_list_in_every_other_respect():
    row = WatchedRow({"choices": [1, 2, 3]}, "x")
    col = row["choices"]
    assert col == [1, 2, 3] and col[-1] == 3 and col[0:2] == [1, 2] and isinstance(col, list)
    col.append(4)  # the reader's change is the row's, and the same object comes back
    assert row["choices"] is col and row["choices"] == [1, 2, 3, 4]
    assert dict(row) == {"choices": [1, 2, 3, 4]} and not row.missing


def test_a_missing_key_is_still_the_rows_and_an_unread_one_is_not():
    row = WatchedRow({"question": "q"}, "x")
    assert data_error(row, _raised(lambda: row["answer"])) == "missing column 'answer'"
    assert data_error(row, KeyError("other")) is None
