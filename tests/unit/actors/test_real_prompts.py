"""Real models, real prompts: on the actor, prompts go through the chat template, generation stops at
every end token of the generation config, and the length cap is on prompt + completion."""

from __future__ import annotations

import random

import pytest
import torch

from streamrl import config
from streamrl.actors import rollout
from streamrl.actors.backends import build as build_backend
from streamrl.models import model as model_lib
from streamrl.tasks import rewards

IM_END, ENDOFTEXT = 151_645, 151_643


@pytest.fixture(scope="module")
def actor(release_model):
    """(cfg, model, tokenizer, hf backend, reward) of an actor on the release-shaped folder."""
    cfg = config.load(None, [f"model.path={release_model}", "actors.max_new_tokens=6", "model.enable_thinking=false"])
    model, tok = model_lib.build(cfg)
    return cfg, model, tok, build_backend("hf", cfg, model, tok), rewards.build(cfg)


def _groups(actor, prompts, **overrides):
    cfg, _, tok, backend, reward = actor
    opts = rollout.RolloutOptions.from_config(cfg)
    opts = rollout.RolloutOptions(**{**{f: getattr(opts, f) for f in opts.__struct_fields__}, **overrides})
    return rollout.make_groups(backend, tok, reward, prompts, opts, 0, "actor-0")


@pytest.fixture
def end_at_third_token(actor):
    """The output layer forced to say <|endoftext|> (the generation config's *second* end token, not
    the tokenizer's EOS) at the third decoding step, and never an end token before."""
    model = actor[1]
    calls = []

    def hook(_module, _inputs, logits):
        logits = logits.clone()
        logits[..., [IM_END, ENDOFTEXT]] = -1e4
        if len(calls) == 2:
            logits[..., ENDOFTEXT] = 1e4
        calls.append(1)
        return logits

    handle = model.lm_head.register_forward_hook(hook)
    yield calls
    handle.remove()


def test_the_actor_sends_prompts_through_the_chat_template(actor):
    cfg, _, tok, _, reward = actor
    prompt = reward.task.sample(random.Random(0))
    groups, _ = _groups(actor, [prompt])
    want = f"<|im_start|>user\n{prompt.text}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert tok.decode(groups[0].prompt_tokens) == want
    raw, _ = _groups(actor, [prompt], chat_template="off")
    assert tok.decode(raw[0].prompt_tokens) == prompt.text


def test_chat_template_on_without_a_template_is_one_clear_error():
    _, tok = model_lib.build(config.load(None))
    with pytest.raises(ValueError, match="model.chat_template=on: the tokenizer has no chat template"):
        rollout.RolloutOptions(group_size=2, r_min_correct=0.5, chat_template="on").encode(tok, "copy : a =")


def test_generation_stops_at_the_second_end_token_of_the_generation_config(actor, end_at_third_token):
    cfg, model, tok, _, reward = actor
    assert model_lib.end_token_ids(model, tok) == [IM_END, ENDOFTEXT] and tok.eos_token_id == IM_END
    torch.manual_seed(0)
    groups, _ = _groups(actor, [reward.task.sample(random.Random(1))])
    comps = _completions(groups[0])
    assert all(len(c) == 3 and c[-1] == ENDOFTEXT for c in comps), comps  # not max_new_tokens (6)
    assert {s.finish_reason for s in groups[0].samples} == {"stop"}


def _completions(group) -> list[list[int]]:
    """Each sample's completion token ids, from the wire group's flat arrays."""
    return [group.sample_tokens(i).tolist() for i in range(group.group_size)]


def test_the_cap_is_on_prompt_plus_completion_and_prompts_without_room_are_counted(actor):
    cfg, _, tok, _, reward = actor
    prompts = [reward.task.sample(random.Random(s)) for s in range(3)]
    n_prompt = len(rollout.RolloutOptions.from_config(cfg).encode(tok, prompts[0].text))
    # room for 2 completion tokens (under max_new_tokens=6): every completion ends within the sequence cap
    groups, stats = _groups(actor, prompts, max_seq_len=n_prompt + 2)
    assert stats.prompts_too_long == 0
    for g in groups:
        for c in _completions(g):
            assert len(g.prompt_tokens) + len(c) <= n_prompt + 2
    # a cap below the prompt: skipped and counted, nothing generated for it
    groups, stats = _groups(actor, prompts, max_seq_len=n_prompt - 1)
    assert groups == [] and stats.prompts_too_long == 3


def test_vllm_and_sglang_receive_every_end_token_as_stop_token_ids(actor, monkeypatch):
    from fakes import fake_sglang
    from fakes import fake_vllm

    cfg, model, tok, _, _ = actor
    llm = fake_vllm.install(monkeypatch)
    build_backend("vllm", cfg, model, tok).generate([[5, 6]], n=2)
    assert llm.instances[-1].calls[-1][1]["sampling_params"].stop_token_ids == [IM_END, ENDOFTEXT]
    engine = fake_sglang.install(monkeypatch)
    build_backend("sglang", cfg, model, tok).generate([[5, 6]], n=2)
    assert engine.instances[-1].calls[-1][1]["sampling_params"]["stop_token_ids"] == [IM_END, ENDOFTEXT]


def test_evaluation_encodes_prompts_as_the_actors_do(actor):
    from streamrl.evaluation import Evaluator

    cfg, model, tok, _, reward = actor
    ev = Evaluator(cfg, reward, model, tok)
    text = ev.prompts[0].text
    assert ev.encode(text) == rollout.RolloutOptions.from_config(cfg).encode(tok, text)
    assert tok.decode(ev.encode(text)).startswith("<|im_start|>user\n")


@pytest.mark.parametrize("path, says", [
    ("/no/such/model", "no such folder"),
    ("models/Nowhere-7B", "not in the local cache while downloads are off"),  # a hub id, offline
    ("EMPTY", "the folder has no config.json"),
])
def test_a_model_path_that_cannot_load_is_one_line_from_check_and_run(path, says, tmp_path, monkeypatch, capsys):
    from streamrl.commands import cli

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if path == "EMPTY":
        path = str(tmp_path)
    for command in ("check", "run"):
        assert cli.main([command, f"model.path={path}"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"model.path={path!r}" in err and says in err, err


def test_a_release_folder_passes_check(release_model, capsys):
    from streamrl.commands import cli

    assert cli.main(["check", f"model.path={release_model}"]) == 0
    assert f"path: {release_model}" in capsys.readouterr().out


def test_offline_difficulty_and_uplift_encode_prompts_as_the_actors_do(actor, monkeypatch, tmp_path):
    from streamrl.commands import uplift
    from streamrl.commands.difficulty import filter_offline
    from streamrl.models import sampling

    cfg, _, tok, _, reward = actor
    items = reward.task.eval_set(2, cfg.eval.seed)
    want = [rollout.RolloutOptions.from_config(cfg).encode(tok, p.text) for p in items]
    assert tok.decode(want[0]).startswith("<|im_start|>user\n")   # the release folder has a chat template
    assert uplift.prompt_ids(cfg, tok, items) == want
    seen = []
    real = sampling.generate
    monkeypatch.setattr(sampling, "generate", lambda model, ids, n, **kw: seen.extend(ids) or real(model, ids, n, **kw))
    filter_offline(cfg, rollouts=1, out=tmp_path / "kept.jsonl", prompts=2)
    assert [list(i) for i in seen] == want
