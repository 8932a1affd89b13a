"""streamrl.models.word_tokenizer against transformers' PreTrainedTokenizerFast over the same backend: the same ids
for text, the same text for ids, the same special tokens; and its transformers twin for exports."""

from __future__ import annotations

import random

import pytest

from streamrl import config, tasks
from streamrl.models.word_tokenizer import SPECIAL_TOKENS, WordTokenizer


@pytest.fixture(scope="module", params=["default", "mgrpo"])
def pair(request):
    from streamrl.algo.mgrpo import phrase_words

    cfg = config.load(None) if request.param == "default" else config.load("configs/mgrpo/tiny.yaml")
    task = tasks.build(cfg.task)
    words = [*task.vocabulary, *(phrase_words(cfg.mgrpo.phrases) if cfg.mgrpo.enabled else [])]
    mine = WordTokenizer(words)
    return mine, mine.to_transformers(), task, words


def test_ids_of_prompts_and_of_any_text_equal_transformers(pair):
    mine, theirs, task, words = pair
    rng = random.Random(0)
    texts = [task.sample(rng).text for _ in range(50)]
    pool = [*words, *SPECIAL_TOKENS, "never-seen", "a<eos>b"]
    texts += [" ".join(rng.choice(pool) for _ in range(rng.randint(0, 12))) for _ in range(200)]
    texts += ["", "  spaced\tout \n words ", "<eos><pad>", words[-1] + "<eos>"]
    for text in texts:
        for add in (True, False):
            got, want = mine(text, add_special_tokens=add), theirs(text, add_special_tokens=add)
            assert got["input_ids"] == want["input_ids"], text
    assert len(mine) == len(theirs)
    tokens = [words[0], "never-seen"]
    assert mine.convert_tokens_to_ids(tokens) == theirs.convert_tokens_to_ids(tokens)


def test_text_of_any_ids_equals_transformers_with_and_without_special_tokens(pair):
    mine, theirs, _, _ = pair
    rng = random.Random(1)
    for _ in range(300):
        ids = [rng.randrange(len(mine)) for _ in range(rng.randint(0, 10))]
        for skip in (True, False):
            assert mine.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip), ids
    assert mine.decode(5) == theirs.decode(5)


def test_special_tokens_and_their_ids_equal_transformers(pair):
    mine, theirs, _, _ = pair
    for name in ("pad", "eos", "bos", "unk"):
        assert getattr(mine, f"{name}_token") == getattr(theirs, f"{name}_token")
        assert getattr(mine, f"{name}_token_id") == getattr(theirs, f"{name}_token_id")
    assert mine.chat_template is None and not theirs.chat_template


def test_saved_files_load_as_the_same_tokenizer(pair, tmp_path):
    from transformers import AutoTokenizer

    mine, _, task, _ = pair
    mine.save_pretrained(str(tmp_path))
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    text = task.sample(random.Random(2)).text
    assert loaded(text, add_special_tokens=False)["input_ids"] == mine(text, add_special_tokens=False)["input_ids"]
    assert loaded.pad_token_id == mine.pad_token_id and loaded.eos_token_id == mine.eos_token_id
