"""Fidelity to the MGRPO paper (Ding et al., arXiv 2506.04746): the layer-2 query's turn format and its
length at the paper's 4,096-token context, on the release-shaped Qwen3 folder's real tokenizer and chat
template. Layer 2 continues the assistant's turn: the layer-1 prompt's tokens, the first answer's own tokens
(never re-tokenised, its end token dropped) and the guiding phrase, with no new user turn between them."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from streamrl import config, tasks
from streamrl.actors import rollout
from streamrl.actors.backends import Completion
from streamrl.algo import mgrpo
from streamrl.models.context import seq_cap

REPO = Path(__file__).resolve().parents[3]
PAPER = REPO / "configs" / "mgrpo" / "qwen2.5-math-7b.yaml"
PHRASE = "Wait, let me double-check that."


class Always:
    """A verifier that passes every text (the rollout needs kept corrections to make layer-2 groups)."""

    grouped, unparseable = False, 0

    def __call__(self, prompt, text) -> float:
        return 1.0


class Scripted:
    """A backend answering every prompt with `answer(call)` completions; records the prompts of each call."""

    def __init__(self, answer):
        self.answer, self.prompts = answer, []

    def generate(self, prompts, n):
        self.prompts.append([list(p) for p in prompts])
        return [[self.answer(len(self.prompts) - 1) for _ in range(n)] for _ in prompts]


@pytest.fixture(scope="module")
def tokenizer(release_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(release_model, local_files_only=True)


def test_fidelity_layer2_continues_the_assistants_turn_with_the_first_answers_own_tokens(tokenizer):
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # the first answer as the model sampled it: character by character, not as the tokenizer would encode its text
    text = "The answer is 5"
    own = [i for ch in text for i in tokenizer(ch, add_special_tokens=False)["input_ids"]]
    assert tokenizer.decode(own) == text and own != tokenizer(text, add_special_tokens=False)["input_ids"]
    first = Completion(own + [end], [-0.5] * (len(own) + 1), "stop")
    backend = Scripted(lambda call: first)
    opts = rollout.RolloutOptions(group_size=2, r_min_correct=1.0, phrases=(PHRASE,), augment=1, chat_template="on")
    prompt = tasks.Prompt(id="q", text="sum 2 3")
    groups, stats = rollout.make_groups(backend, tokenizer, Always(), [prompt], opts, 0, "actor-0", random.Random(0))

    messages = [{"role": "user", "content": prompt.text}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    p_ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    query = p_ids + own + tokenizer("\n" + PHRASE, add_special_tokens=False)["input_ids"]
    assert backend.prompts[0] == [p_ids] and backend.prompts[1] == [query, query]   # both corrections' queries
    layer2 = [g for g in groups if g.layer == 2]
    assert len(layer2) == 2 and all(g.prompt_tokens.tolist() == query for g in layer2)
    # as text: the template's rendering of the question, then the first answer and the phrase in the same turn
    as_text = tokenizer.decode(query)
    assert as_text == rendered + text + "\n" + PHRASE
    assert as_text.count("<|im_start|>user") == 1 and as_text.count("<|im_start|>assistant") == 1
    assert "<|im_end|>" not in as_text[as_text.index("<|im_start|>assistant"):]   # the assistant turn never closed
    assert (stats.queries_capped, stats.corrections, stats.corrections_kept) == (0, 2, 2)


def test_fidelity_an_answer_cut_by_the_length_cap_is_continued_as_it_is(tokenizer):
    own = tokenizer("The answer is", add_special_tokens=False)["input_ids"]
    backend = Scripted(lambda call: Completion(own, [-0.5] * len(own), "length"))   # no end token to drop
    opts = rollout.RolloutOptions(group_size=1, r_min_correct=1.0, phrases=(PHRASE,), augment=0, chat_template="on")
    rollout.make_groups(backend, tokenizer, Always(), [tasks.Prompt(id="q", text="sum 2 3")], opts, 0, "a",
                        random.Random(0))
    p_ids = backend.prompts[0][0]
    assert backend.prompts[1][0] == p_ids + own + mgrpo.phrase_ids(tokenizer, PHRASE)


@pytest.fixture(scope="module")
def context_4096(release_model, tmp_path_factory) -> Path:
    """The release-shaped folder's tokenizer and configs with the paper's context: max_position_embeddings 4096."""
    folder = tmp_path_factory.mktemp("ctx4096")
    for f in Path(release_model).iterdir():
        if f.is_file() and not f.name.endswith(".safetensors"):
            shutil.copy(f, folder / f.name)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 4096}))
    return folder


@pytest.mark.parametrize("overrides", [[], ["model.max_seq_len=null"]], ids=["as-shipped", "context-from-folder"])
def test_fidelity_the_paper_configs_layer2_query_keeps_the_question_and_the_whole_first_answer(
        tokenizer, context_4096, overrides):
    cfg = config.load(PAPER, [f"model.path={context_4096}", *overrides])
    assert seq_cap(cfg.model) == 4096 and cfg.actors.max_new_tokens == 8196   # completions may be longer than it
    opts = rollout.RolloutOptions.from_config(cfg)
    assert opts.query_limit == 4096 - 512 and opts.context == 4096   # before: 4096 - 8196, floored at 1 token
    question = tasks.Prompt(id="q", text="Natalia sold clips to 48 of her friends in April, and then she sold half "
                                         "as many clips in May. How many clips did Natalia sell altogether?")
    p_ids = opts.encode(tokenizer, question)
    digit = tokenizer("7", add_special_tokens=False)["input_ids"]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def answer(n: int, stop: bool) -> Completion:
        toks = digit * n + ([end] if stop else [])
        return Completion(toks, [-0.1] * len(toks), "stop" if stop else "length")

    long_correction = answer(5000, False)   # a correction that would run past the context: cut where it ends
    backend = Scripted(lambda call: answer(3000, True) if call == 0 else long_correction)
    groups, stats = rollout.make_groups(backend, tokenizer, Always(), [question], opts, 0, "actor-0",
                                        random.Random(0))
    phrases = [mgrpo.phrase_ids(tokenizer, p) for p in cfg.mgrpo.phrases]
    layer2 = [g for g in groups if g.layer == 2]
    assert len(layer2) == cfg.actors.group_size and stats.queries_capped == 0
    for g in layer2:
        q = g.prompt_tokens.tolist()
        assert q[:len(p_ids)] == p_ids and q[len(p_ids):len(p_ids) + 3000] == digit * 3000   # question, whole answer
        assert q[len(p_ids) + 3000:] in phrases
        assert len(q) + max(len(g.sample_tokens(i)) for i in range(g.group_size)) == 4096   # the corrections end at the context
    assert len(groups) == cfg.actors.group_size + 1   # 8 layer-2 groups beside the layer-1 group

    # an answer that leaves a correction less than mgrpo.min_correction_tokens is cut in the middle, and counted
    backend = Scripted(lambda call: answer(4000 - len(p_ids), True) if call == 0 else long_correction)
    groups, stats = rollout.make_groups(backend, tokenizer, Always(), [question], opts, 0, "actor-0",
                                        random.Random(0))
    assert stats.queries_capped == cfg.actors.group_size
    for g in (g for g in groups if g.layer == 2):
        q = g.prompt_tokens.tolist()
        assert len(q) == 4096 - 512 and q[:len(p_ids)] == p_ids and any(q[-len(p):] == p for p in phrases)
