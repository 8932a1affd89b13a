"""The one reader of task data: rows from a .jsonl/.json/.parquet file, a `datasets.Dataset.save_to_disk`
folder, or a hub dataset id, streamed one at a time and each checked on its own.

A row that fails its task's check is a `Problem` naming the source, the row (1-based: the line of a JSONL
file, the row of a table) and what is wrong. `read` returns the good rows and every problem; `scan` is what
`streamrl check` and `streamrl run` use before anything starts: it counts the usable rows and the problems,
holding only the first `SHOWN` of them, so a 10 GB file is checked in constant memory; `load` is what a
task uses: problems are logged with their count and skipped, and a source with no usable row is refused.

The rules a row must pass before its task's check:
- Encoding: UTF-8; a UTF-8 byte-order mark is accepted (and dropped); a file whose byte-order mark says
  UTF-16 or UTF-32 is refused as a whole; a byte that is not UTF-8 is a problem naming its line and its byte
  offset in the file.
- Size: a row above `task.max_row_bytes` (a JSONL line; a table row as JSON) is a problem, skipped. A JSONL
  line that long is never held whole: the reader reads at most the limit of it and skips the rest, so no
  single line can run a process out of memory before a tokenizer ever sees it.
- A .json file is one list and is read whole, so it may hold at most `JSON_FILE_BYTES`; larger data goes in
  .jsonl or .parquet, which stream. Parquet goes through pyarrow one batch at a time, folders and hub ids
  through `datasets` (memory-mapped Arrow; imported only then: the tiny job's start-up never pays for it).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

import msgspec

T = TypeVar("T")
log = logging.getLogger("streamrl.tasks")
FORMATS = ".jsonl, .json, .parquet, a datasets.save_to_disk folder, or a hub dataset id (with a network)"
ENCODINGS = "data files must be UTF-8 (a UTF-8 byte-order mark is accepted)"
MAX_ROW_BYTES = 1 << 20
"""task.max_row_bytes's default: 1 MiB, far above any prompt a model's context holds."""
JSON_FILE_BYTES = 256 << 20
"""Largest .json file (read whole); larger data streams as .jsonl or .parquet."""
SHOWN = 20
"""Problems `scan` holds (and `streamrl check` prints) per source; the rest are counted."""
UTF8_BOM = b"\xef\xbb\xbf"
_OTHER_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
               (b"\xfe\xff", "UTF-16"))
_BATCH = 64  # Parquet rows per batch: a batch of long rows stays small


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


class Scan(NamedTuple):
    """What `scan` found in a source, without its rows."""

    source: str
    usable: int
    count: int
    """Rows that were skipped (every one counted)."""
    problems: list
    """The first `SHOWN` of them, as `Problem`s, in row order."""


def rows(source: str | Path, max_row_bytes: int = MAX_ROW_BYTES) -> Iterator[tuple[int, Any] | Problem]:
    """Every row of `source` in order, one at a time: (row number, raw value), or a `Problem` for a row that
    cannot be decoded or is above `max_row_bytes`. Raises ValueError (when iterated) naming the source when
    the source itself cannot be read."""
    src = str(source)
    p = Path(source)
    if not p.exists() and p.suffix in (".jsonl", ".json", ".parquet"):
        raise ValueError(f"{src}: no such file or folder; give {FORMATS}")
    if p.is_dir():
        return _table(src, _load_from_disk(p), max_row_bytes)
    if p.suffix == ".jsonl":
        return _jsonl(p, max_row_bytes)
    if p.suffix == ".json":
        return _json(p, max_row_bytes)
    if p.suffix == ".parquet":
        return _table(src, _parquet(p), max_row_bytes)
    if p.exists():
        raise ValueError(f"{src}: unknown data format {p.suffix!r}; give {FORMATS}")
    if src.count("/") == 1 and not src.startswith((".", "/")) and not p.suffix:
        return _table(src, _hub(src), max_row_bytes)
    raise ValueError(f"{src}: no such file or folder; give {FORMATS}")


def raw_rows(source: str | Path, max_row_bytes: int = MAX_ROW_BYTES) -> tuple[list[tuple[int, Any]], list[Problem]]:
    """(row number, raw value) of every row of `source`, and the rows that could not even be decoded."""
    good, problems = [], []
    for item in rows(source, max_row_bytes):
        (problems if isinstance(item, Problem) else good).append(item)
    return good, problems


def _too_long(src: str, n: int, size: int, limit: int, unread: bool = False) -> Problem:
    return Problem(src, n, f"the row is {size:,} bytes, above task.max_row_bytes={limit:,}; skipped"
                           f"{' unread' if unread else ''} (shorten the row, or raise task.max_row_bytes)")


def _refuse_other_bom(src: str, head: bytes) -> None:
    for bom, name in _OTHER_BOMS:
        if head.startswith(bom):
            raise ValueError(f"{src}: the file is {name} (its byte-order mark says so); {ENCODINGS}: "
                             "save it as UTF-8, e.g. iconv -f " + name + " -t UTF-8")


def _not_utf8(data: bytes, base: int, whole_file: bool = False) -> str | None:
    """Where `data` (a line, or the whole file, starting at byte `base` of the file) stops being UTF-8, in words;
    None if it is UTF-8. Asked after the JSON decoder fails, whatever it raised: msgspec 0.22 raised
    UnicodeDecodeError on a byte that is not UTF-8, 0.23 a DecodeError ("Invalid UTF-8 encoded string")."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        newlines = data.count(b"\n", 0, e.start)
        where = f"line {newlines + 1}" if whole_file else f"column {e.start + 1} of its line"
        return (f"not UTF-8: byte 0x{data[e.start]:02x} at byte {base + e.start} of the file ({where}); {ENCODINGS}: "
                "save it as UTF-8, e.g. iconv -f latin1 -t UTF-8")
    return None


def _jsonl(p: Path, limit: int) -> Iterator[tuple[int, Any] | Problem]:
    src = str(p)
    with open(p, "rb") as f:
        head = f.read(4)
        _refuse_other_bom(src, head)
        offset = len(UTF8_BOM) if head.startswith(UTF8_BOM) else 0
        f.seek(offset)
        for n in itertools.count(1):
            line = f.readline(limit + 2)  # `limit` bytes, a \r\n, or one byte more to tell that the line is longer
            if not line:
                return
            start, offset = offset, offset + len(line)
            if len(line.rstrip(b"\r\n")) > limit:
                rest = _skip_line(f) if not line.endswith(b"\n") else 0
                offset += rest
                yield _too_long(src, n, len(line.rstrip(b"\r\n")) + rest, limit, unread=True)
                continue
            if not line.strip():
                continue
            try:
                yield n, msgspec.json.decode(line)
            except (msgspec.DecodeError, UnicodeDecodeError) as e:
                yield Problem(src, n, _not_utf8(line, start) or f"not valid JSON: {e}")


def _skip_line(f) -> int:
    """Read past the rest of the current line in pieces; the bytes skipped, its newline not counted."""
    skipped = 0
    while chunk := f.readline(1 << 16):
        if chunk.endswith(b"\n"):
            return skipped + len(chunk.rstrip(b"\r\n"))
        skipped += len(chunk)
    return skipped


def _json(p: Path, limit: int) -> Iterator[tuple[int, Any] | Problem]:
    src = str(p)
    if (size := p.stat().st_size) > JSON_FILE_BYTES:
        raise ValueError(f"{src}: a .json file is read whole, and this one is {size:,} bytes (at most "
                         f"{JSON_FILE_BYTES:,}); give the rows as .jsonl (one object a line) or .parquet, which stream")
    raw = p.read_bytes()
    _refuse_other_bom(src, raw)
    base = len(UTF8_BOM) if raw.startswith(UTF8_BOM) else 0
    try:
        data = msgspec.json.decode(memoryview(raw)[base:])
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{src}: " + (_not_utf8(raw[base:], base, whole_file=True)
                                       or f"not valid JSON ({e}); a .json file holds a list of row objects")) from None
    if not isinstance(data, list):
        raise ValueError(f"{src}: a .json file holds a list of row objects, got {type(data).__name__}")
    return _table(src, data, limit)


def _table(src: str, table, limit: int) -> Iterator[tuple[int, Any] | Problem]:
    """Rows of a decoded list or table, each measured as JSON against the limit."""
    for n, row in enumerate(table, 1):
        size = len(msgspec.json.encode(row, enc_hook=str))
        yield _too_long(src, n, size, limit) if size > limit else (n, row)


def _parquet(p: Path):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{p}: reading Parquet needs pyarrow, which is not installed here: pip install pyarrow "
                         "(a dependency of streamrl), or give the rows as .jsonl") from None
    try:
        f = pq.ParquetFile(p)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid (a ValueError): the file is no Parquet
        raise ValueError(f"{p}: not a Parquet file ({e}); a .parquet file is Apache Parquet (pandas.DataFrame."
                         "to_parquet, datasets.Dataset.to_parquet); rows of JSON go in .jsonl") from None
    return (row for batch in f.iter_batches(batch_size=_BATCH) for row in batch.to_pylist())


def _load_from_disk(p: Path):
    import datasets

    ds = datasets.load_from_disk(str(p))
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise ValueError(f"{p}: a DatasetDict with splits {sorted(ds)}; save the split to use, or name one 'train'")
        ds = ds["train"]
    return ds


def _hub(name: str):
    import datasets

    try:
        return datasets.load_dataset(name, split="train")
    except Exception as e:  # offline machines land here: say so rather than print a network traceback
        raise ValueError(f"{name}: not a local file or folder, and loading it as a hub dataset failed "
                         f"({type(e).__name__}: {e}); give {FORMATS}") from None


def _converted(source, convert: Callable[[Any], T], max_row_bytes: int) -> Iterator[tuple[int, T] | Problem]:
    for item in rows(source, max_row_bytes):
        if isinstance(item, Problem):
            yield item
            continue
        n, row = item
        try:
            yield n, convert(row)
        except (ValueError, TypeError, KeyError, msgspec.ValidationError) as e:
            yield Problem(str(source), n, str(e) or type(e).__name__)


def read(source: str | Path, convert: Callable[[Any], T], max_row_bytes: int = MAX_ROW_BYTES) -> Rows:
    """Every row of `source` through `convert` (raises ValueError, TypeError or msgspec.ValidationError on a bad
    row). Never raises for a bad row; raises ValueError when the source itself cannot be read."""
    items, numbers, problems = [], [], []
    for item in _converted(source, convert, max_row_bytes):
        if isinstance(item, Problem):
            problems.append(item)
        else:
            numbers.append(item[0])
            items.append(item[1])
    return Rows(str(source), items, problems, numbers)


def scan(source: str | Path, convert: Callable[[Any], Any], max_row_bytes: int = MAX_ROW_BYTES,
         keep: int = SHOWN) -> Scan:
    """Count the usable rows and the problems of `source` without holding its rows (the first `keep` problems
    are kept). Raises ValueError when the source itself cannot be read."""
    usable = count = 0
    shown = []
    for item in _converted(source, convert, max_row_bytes):
        if isinstance(item, Problem):
            count += 1
            if len(shown) < keep:
                shown.append(item)
        else:
            usable += 1
    return Scan(str(source), usable, count, shown)


def load(source: str | Path, convert: Callable[[Any], T], what: str, max_row_bytes: int = MAX_ROW_BYTES) -> list[T]:
    """The usable rows of `source`; skipped rows are logged (the first few, and how many). `what` says what a
    row holds, for the refusal of a source without one usable row."""
    return load_rows(source, convert, what, max_row_bytes).items


def load_rows(source: str | Path, convert: Callable[[Any], T], what: str, max_row_bytes: int = MAX_ROW_BYTES) -> Rows:
    """As `load`, with each usable row's number (`Rows.numbers`: a JSONL file's line) beside it."""
    rows = read(source, convert, max_row_bytes)
    if not rows.items:
        first = "; ".join(map(str, rows.problems[:3])) or "the source is empty"
        raise ValueError(f"{source}: no usable row ({len(rows.problems)} malformed; a row is {what}): {first}")
    if rows.problems:
        log.warning("%s: skipped %d row(s) of %d with a problem (streamrl check lists them): %s", source,
                    len(rows.problems), len(rows.problems) + len(rows.items), "; ".join(map(str, rows.problems[:3])))
    return rows


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
