"""The one reader of task data: rows from a .jsonl/.json/.parquet file, a `datasets.Dataset.save_to_disk`
folder, or a hub dataset id, each row checked on its own.

A row that fails its task's check is a `Problem` naming the source, the row (1-based: the line of a JSONL
file, the row of a table) and what is wrong. `read` returns the good rows and every problem (what
`streamrl check` prints); `load` is what a run uses: problems are logged with their count and skipped,
and a source with no usable row is refused before anything starts. JSONL is split by line here so that
one broken line costs one row; Parquet goes through pyarrow, folders and hub ids through `datasets`
(imported only then: the tiny job's start-up never pays for it).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Generic, NamedTuple, TypeVar

import msgspec

T = TypeVar("T")
log = logging.getLogger("streamrl.tasks")
FORMATS = ".jsonl, .json, .parquet, a datasets.save_to_disk folder, or a hub dataset id (with a network)"


class Problem(NamedTuple):
    source: str
    row: int
    """1-based: a JSONL file's line, a table's row (0: the source as a whole)."""
    message: str

    def __str__(self) -> str:
        return f"{self.source}:{self.row}: {self.message}" if self.row else f"{self.source}: {self.message}"


class Rows(msgspec.Struct, Generic[T]):
    source: str
    items: list
    """The usable rows, converted, in file order."""
    problems: list
    """Every row that was skipped, as a `Problem`."""
    numbers: list = []
    """items[i]'s row number (1-based) in the source."""


def raw_rows(source: str | Path) -> tuple[list[tuple[int, Any]], list[Problem]]:
    """(row number, raw value) of every row of `source`, and the rows that could not even be decoded."""
    src = str(source)
    p = Path(source)
    if not p.exists() and p.suffix in (".jsonl", ".json", ".parquet"):
        raise ValueError(f"{src}: no such file or folder; give {FORMATS}")
    if p.is_dir():
        return _enumerate(_load_from_disk(p)), []
    if p.suffix == ".jsonl":
        return _jsonl(p)
    if p.suffix == ".json":
        try:
            data = msgspec.json.decode(p.read_bytes())
        except msgspec.DecodeError as e:
            raise ValueError(f"{src}: not valid JSON ({e}); a .json file holds a list of row objects") from None
        if not isinstance(data, list):
            raise ValueError(f"{src}: a .json file holds a list of row objects, got {type(data).__name__}")
        return _enumerate(data), []
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        return _enumerate(pq.read_table(p).to_pylist()), []
    if p.exists():
        raise ValueError(f"{src}: unknown data format {p.suffix!r}; give {FORMATS}")
    if src.count("/") == 1 and not src.startswith((".", "/")) and not p.suffix:
        return _enumerate(_hub(src)), []
    raise ValueError(f"{src}: no such file or folder; give {FORMATS}")


def _enumerate(rows) -> list[tuple[int, Any]]:
    return [(n, row) for n, row in enumerate(rows, 1)]


def _jsonl(p: Path) -> tuple[list[tuple[int, Any]], list[Problem]]:
    rows, problems = [], []
    with open(p, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append((n, msgspec.json.decode(line)))
            except msgspec.DecodeError as e:
                problems.append(Problem(str(p), n, f"not valid JSON: {e}"))
    return rows, problems


def _load_from_disk(p: Path) -> list[dict]:
    import datasets

    ds = datasets.load_from_disk(str(p))
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise ValueError(f"{p}: a DatasetDict with splits {sorted(ds)}; save the split to use, or name one 'train'")
        ds = ds["train"]
    return ds.to_list()


def _hub(name: str) -> list[dict]:
    import datasets

    try:
        return datasets.load_dataset(name, split="train").to_list()
    except Exception as e:  # offline machines land here: say so rather than print a network traceback
        raise ValueError(f"{name}: not a local file or folder, and loading it as a hub dataset failed "
                         f"({type(e).__name__}: {e}); give {FORMATS}") from None


def read(source: str | Path, convert: Callable[[Any], T]) -> Rows:
    """Every row of `source` through `convert` (raises ValueError, TypeError or msgspec.ValidationError on a bad
    row). Never raises for a bad row; raises ValueError when the source itself cannot be read."""
    raw, problems = raw_rows(source)
    items, numbers = [], []
    for n, row in raw:
        try:
            items.append(convert(row))
            numbers.append(n)
        except (ValueError, TypeError, KeyError, msgspec.ValidationError) as e:
            problems.append(Problem(str(source), n, str(e) or type(e).__name__))
    problems.sort(key=lambda p: p.row)
    return Rows(str(source), items, problems, numbers)


def load(source: str | Path, convert: Callable[[Any], T], what: str) -> list[T]:
    """The usable rows of `source`; skipped rows are logged (the first few, and how many). `what` says what a
    row holds, for the refusal of a source without one usable row."""
    rows = read(source, convert)
    if not rows.items:
        first = "; ".join(map(str, rows.problems[:3])) or "the source is empty"
        raise ValueError(f"{source}: no usable row ({len(rows.problems)} malformed; a row is {what}): {first}")
    if rows.problems:
        log.warning("%s: skipped %d malformed row(s) of %d (streamrl check lists them): %s", source,
                    len(rows.problems), len(rows.problems) + len(rows.items), "; ".join(map(str, rows.problems[:3])))
    return rows.items


def struct_row(struct: type, hint: str) -> Callable[[Any], Any]:
    """A `convert` that makes a msgspec Struct of a row object (a JSON object or a table row), naming `hint`."""

    def convert(row):
        if not isinstance(row, dict):
            raise ValueError(f"a row is an object ({hint}), got {type(row).__name__}")
        try:
            return msgspec.convert(row, struct)
        except msgspec.ValidationError as e:
            raise ValueError(f"{e} ({hint})") from None

    return convert
