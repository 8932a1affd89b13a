"""The one reader of task data (streamrl.tasks.data) and the dataset task's rows and prompts."""

from __future__ import annotations

import json

import pytest

from streamrl import config as config_lib
from streamrl.models import prompting
from streamrl.models.word_tokenizer import WordTokenizer
from streamrl.tasks import data, dataset, math_answer

CHAT = [{"prompt": [{"role": "system", "content": "Answer with the last word."},
                    {"role": "user", "content": "red green blue"}], "answer": "blue"},
        {"prompt": [{"role": "system", "content": "Answer with the first word."},
                    {"role": "user", "content": "pink black white"}], "answer": "pink"}]


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_jsonl_parquet_and_a_save_to_disk_folder_give_the_same_prompts(tmp_path):
    import datasets

    jsonl = write_jsonl(tmp_path / "rows.jsonl", CHAT)
    ds = datasets.Dataset.from_list(CHAT)
    ds.to_parquet(str(tmp_path / "rows.parquet"))
    ds.save_to_disk(str(tmp_path / "rows_folder"))
    (tmp_path / "rows.json").write_text(json.dumps(CHAT))
    convert = dataset.converter("prompt")
    got = {src: data.load(tmp_path / src, convert, "rows") for src in
           ("rows.jsonl", "rows.parquet", "rows_folder", "rows.json")}
    assert got["rows.jsonl"] == got["rows.parquet"] == got["rows_folder"] == got["rows.json"]
    task = dataset.DatasetTask.__new__(dataset.DatasetTask)
    prompts = {src: [task.prompt(r) for r in rows] for src, rows in got.items()}
    assert len({tuple(p.id for p in ps) for ps in prompts.values()}) == 1
    assert prompts["rows.parquet"][0].messages[0] == {"role": "system", "content": "Answer with the last word."}
    assert prompts["rows.parquet"][0].columns == {"answer": "blue"}
    assert str(jsonl)  # the source names itself in problems (below)


def test_every_malformed_row_is_named_with_its_line_and_the_good_rows_are_kept(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [
        CHAT[0],
        "{not json",
        {"question": "no prompt field"},
        {"prompt": [{"role": "wizard", "content": "x"}]},
        {"prompt": [{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}]},
        {"prompt": ""},
        {"prompt": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
        CHAT[1],
    ])
    rows = data.read(path, dataset.converter("prompt"))
    assert len(rows.items) == 2 and rows.numbers == [1, 8]
    problems = [str(p) for p in rows.problems]
    assert [p.row for p in rows.problems] == [2, 3, 4, 5, 6, 7]
    assert all(p.startswith(f"{path}:") for p in problems)
    for text, want in zip(problems, ["not valid JSON", "no 'prompt' field", "role 'wizard'; allowed: system, user",
                                     "a system message comes first", "'prompt' is empty", "must be a user turn"]):
        assert want in text, (text, want)


def test_a_source_with_no_usable_row_is_refused_naming_the_first_problems(tmp_path):
    path = write_jsonl(tmp_path / "none.jsonl", [{"problem": "1+1"}, "oops"])
    with pytest.raises(ValueError, match=r"no usable row \(2 malformed.*none.jsonl:1: .*answer"):
        math_answer.read_jsonl(path)


def test_an_unknown_format_or_missing_file_says_what_is_allowed(tmp_path):
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"unknown data format '.csv'; give .jsonl, .json, .parquet"):
        data.read(tmp_path / "rows.csv", dataset.converter("prompt"))
    with pytest.raises(ValueError, match="no such file or folder"):
        data.read(tmp_path / "missing.jsonl", dataset.converter("prompt"))


def test_chat_messages_go_through_the_chat_template_and_render_as_lines_without_one():
    messages = CHAT[0]["prompt"]
    words = WordTokenizer("Answer with the last word. red green blue".split())
    assert words.decode(prompting.encode(words, messages, chat=False)) == "Answer with the last word. red green blue"

    class Templated:
        chat_template = "x"

        def apply_chat_template(self, msgs, tokenize, add_generation_prompt):
            assert not tokenize and add_generation_prompt
            return "|".join(f"{m['role']}:{m['content']}" for m in msgs) + "|assistant:"

        def __call__(self, text, add_special_tokens):
            return {"input_ids": [len(w) for w in text.split("|")]}

    assert prompting.encode(Templated(), messages, chat=True) == [len("system:Answer with the last word."),
                                                                  len("user:red green blue"), len("assistant:")]
    assert prompting.encode(Templated(), "hi", chat=True) == [len("user:hi"), len("assistant:")]


def test_the_dataset_task_needs_data_a_reward_and_a_scale():
    with pytest.raises(config_lib.ConfigError, match="needs task.data"):
        config_lib.load(None, ["task.name=dataset"])
    with pytest.raises(config_lib.ConfigError, match="needs a scale"):
        config_lib.load(None, ["task.name=dataset", "task.data=x.jsonl", "task.reward=m:f"])
    with pytest.raises(config_lib.ConfigError, match="r_min_correct=0.75: not a level.*allowed: 0.5, 1.0"):
        config_lib.load(None, ["task.name=dataset", "task.data=x.jsonl", "task.reward=m:f",
                               "task.reward_levels=[0, 0.5, 1]"])
    cfg = config_lib.load(None, ["task.name=dataset", "task.data=x.jsonl", "task.reward=m:f",
                                 "reward.bucket_edges=[0.3, 0.6]", "advantage.r_min_correct=1.0"])
    assert cfg.advantage.r_min_correct == 1.0  # a continuous reward's levels are its buckets
