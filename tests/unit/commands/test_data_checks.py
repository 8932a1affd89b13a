"""Data checked before anything starts (issue 31 item 6): `streamrl check` and `streamrl run` read every row of
task.data through the one reader, streaming, and name each problem with its file and row; encodings, byte-order
marks and Parquet are handled; no row can run an actor out of memory; a completion cap beyond the model's
positions is refused."""

from __future__ import annotations

import json
import sys
import tracemalloc

import pytest

from streamrl import config
from streamrl.commands import cli
from streamrl.tasks import data, math_answer

FREE = ["transport.group_port=0", "transport.weights_port=0", "transport.weights_request_port=0",
        "monitoring.learner_port=0", "monitoring.actor_port=0"]
GOOD = b'{"problem": "1+1", "answer": "2"}\n'


def _check(tmp_path, capsys, source, *more, command="check") -> tuple[int, list[str]]:
    capsys.readouterr()
    rc = cli.main([command, "task.name=math", f"task.data={source}", "advantage.r_min_correct=1.0",
                   f"run_dir={tmp_path / 'runs'}", "name=d", *FREE, *more])
    return rc, capsys.readouterr().err.strip().splitlines()


def test_check_refuses_a_missing_data_file(tmp_path, capsys):
    rc, err = _check(tmp_path, capsys, tmp_path / "missing.jsonl")
    assert rc == 2 and any("missing.jsonl: no such file" in line for line in err), err


def test_check_names_every_malformed_row_with_its_line_and_caps_the_printout(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(GOOD + b"{oops\n" * 30 + GOOD)
    rc, err = _check(tmp_path, capsys, path)
    assert rc == 0  # a run skips malformed rows: they are warnings
    named = [line for line in err if f"{path}:" in line and "not valid JSON" in line]
    assert [int(line.split(f"{path}:")[1].split(":")[0]) for line in named] == list(range(2, 2 + data.SHOWN))
    assert any(f"and {30 - data.SHOWN} more" in line for line in err), err
    assert any("30 of 32 rows" in line for line in err), err
    assert data.scan(path, math_answer.ROW).count == 30  # every problem counted, only the first few held


def test_a_non_utf8_byte_is_named_with_its_file_line_and_byte_offset(tmp_path, capsys):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(GOOD + b'{"problem": "caf\xe9 2+2", "answer": "4"}\n' + GOOD)
    rc, err = _check(tmp_path, capsys, path)
    offset = len(GOOD) + len(b'{"problem": "caf')
    [line] = [line for line in err if "UTF-8" in line]
    assert f"{path}:2: " in line and "byte 0xe9" in line and f"at byte {offset} of the file" in line, line
    assert "a UTF-8 byte-order mark is accepted" in line  # what is allowed
    assert rc == 0 and any("1 of 3 rows" in line for line in err)


def test_a_utf8_bom_is_accepted_and_a_utf16_file_is_refused_naming_its_encoding(tmp_path, capsys):
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + GOOD + GOOD)
    rc, err = _check(tmp_path, capsys, bom)
    assert rc == 0 and not [line for line in err if "bom.jsonl" in line], err
    assert len(data.read(bom, math_answer.ROW).items) == 2
    utf16 = tmp_path / "utf16.jsonl"
    utf16.write_bytes((GOOD + GOOD).decode().encode("utf-16"))
    rc, err = _check(tmp_path, capsys, utf16)
    assert rc == 2 and any("utf16.jsonl: the file is UTF-16" in line and "must be UTF-8" in line for line in err), err


def test_a_parquet_file_is_read_as_parquet_and_a_bad_one_or_a_missing_pyarrow_is_one_clear_line(tmp_path, capsys,
                                                                                               monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([{"problem": "1+1", "answer": "2"}, {"problem": "x", "answer": None}]), good)
    rc, err = _check(tmp_path, capsys, good)
    assert rc == 0 and any(f"{good}:2: " in line for line in err), err  # a table row is named by its number
    fake = tmp_path / "fake.parquet"
    fake.write_bytes(GOOD)
    rc, err = _check(tmp_path, capsys, fake)
    assert rc == 2 and any("fake.parquet: not a Parquet file" in line for line in err), err
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    rc, err = _check(tmp_path, capsys, good)
    assert rc == 2 and any("rows.parquet: reading Parquet needs pyarrow" in line and "pip install" in line
                           for line in err), err


def test_a_5mb_row_is_refused_before_decoding_and_never_held_whole(tmp_path, capsys):
    path = tmp_path / "big.jsonl"
    big = json.dumps({"problem": "w " * (5 << 19), "answer": "2"}).encode() + b"\n"
    path.write_bytes(GOOD + big + GOOD)
    tracemalloc.start()
    try:
        rows = data.read(path, math_answer.ROW, max_row_bytes=1 << 16)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak  # the reader held at most about the limit of the 5 MB row, never all of it
    assert rows.numbers == [1, 3]
    [p] = rows.problems
    assert p.row == 2 and f"{len(big) - 1:,} bytes" in p.message and "task.max_row_bytes=65,536" in p.message
    rc, err = _check(tmp_path, capsys, path)  # the default limit (1 MiB) refuses it too
    assert rc == 0 and any(f"{path}:2: " in line and "task.max_row_bytes=1,048,576" in line for line in err), err


def test_check_streams_the_rows_rather_than_holding_them(tmp_path):
    path = tmp_path / "many.jsonl"
    path.write_bytes(GOOD * 40_000 + b"{oops\n" * 1000)  # 1.4 MB, 41,000 rows
    tracemalloc.start()
    try:
        got = data.scan(path, math_answer.ROW)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (got.usable, got.count, len(got.problems)) == (40_000, 1000, data.SHOWN)
    assert peak < 400_000, peak  # holding the rows would take several MB


def test_run_with_unreadable_data_fails_before_the_run_directory_is_claimed(tmp_path, capsys):
    path = tmp_path / "all-latin1.jsonl"
    path.write_bytes(b'{"problem": "caf\xe9", "answer": "4"}\n')
    rc, err = _check(tmp_path, capsys, path, command="run")
    assert rc == 2 and any("all-latin1.jsonl:1: " in line and "not UTF-8" in line for line in err), err
    assert any("no usable row of 1" in line for line in err), err
    assert not (tmp_path / "runs" / "d").exists()


@pytest.mark.parametrize("more,want", [
    (["actors.max_new_tokens=1000"], "actors.max_new_tokens=1000: the model has 256 positions (model.context)"),
    (["model.max_seq_len=4096"], "model.max_seq_len=4096: the model has 256 positions (model.context)"),
    (["eval.max_new_tokens=256"], "eval.max_new_tokens=256: the model has 256 positions (model.context)"),
])
def test_a_completion_cap_beyond_the_models_positions_is_refused(tmp_path, capsys, more, want):
    capsys.readouterr()
    assert cli.main(["check", f"run_dir={tmp_path}", *FREE, *more]) == 2
    assert any(want in line for line in capsys.readouterr().err.splitlines())


def test_a_folders_positions_come_from_its_config_json(tmp_path, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 128}))
    capsys.readouterr()
    assert cli.main(["check", f"model.path={folder}", "actors.max_new_tokens=200", f"run_dir={tmp_path}", *FREE]) == 2
    assert "the model has 128 positions (max_position_embeddings" in capsys.readouterr().err


def test_a_prompt_longer_than_the_models_context_leaves_no_room_without_max_seq_len():
    from streamrl.actors.rollout import RolloutOptions

    opts = RolloutOptions.from_config(config.load(None, []))  # model.max_seq_len unset: the tiny model's 256
    assert opts.room([1] * 200) == 4 and opts.room([1] * 254) == 2 and opts.room([1] * 256) <= 0


@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"])
@pytest.mark.parametrize("eol", [b"\n", b"\r\n"])
def test_a_row_of_exactly_max_row_bytes_is_read_and_one_byte_more_is_not(tmp_path, bom, eol):
    path = tmp_path / "edge.jsonl"
    path.write_bytes(bom + GOOD.rstrip() + eol + GOOD.rstrip() + eol)
    size = len(GOOD.rstrip())
    assert data.read(path, math_answer.ROW, max_row_bytes=size).numbers == [1, 2]
    rows = data.read(path, math_answer.ROW, max_row_bytes=size - 1)
    assert rows.items == [] and [(p.row, f"is {size} bytes" in p.message) for p in rows.problems] == [(1, True), (2, True)]


def test_a_json_file_names_a_non_utf8_byte_by_line_and_offset(tmp_path):
    path = tmp_path / "rows.json"
    head = b'[\n{"problem": "1+1", "answer": "2"},\n{"problem": "caf'
    path.write_bytes(head + b'\xe9", "answer": "2"}\n]\n')
    with pytest.raises(ValueError, match=rf"rows.json: not UTF-8: byte 0xe9 at byte {len(head)} of the file \(line 3\)"):
        data.read(path, math_answer.ROW)


def test_a_table_row_above_max_row_bytes_is_named_too(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([{"problem": "1+1", "answer": "2"}, {"problem": "x" * 5000, "answer": "2"}]),
                   path)
    rows = data.read(path, math_answer.ROW, max_row_bytes=1000)
    assert rows.numbers == [1] and [p.row for p in rows.problems] == [2]
    assert "above task.max_row_bytes=1,000; skipped (" in rows.problems[0].message
