"""The release-shaped model folder: what a Qwen3 release holds, made offline (streamrl.models.release_model)."""

from __future__ import annotations

import json
from pathlib import Path

from streamrl.models import release_model


def test_the_folder_has_a_qwen3_release_shape(release_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(release_model)
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["model_type"] == "qwen3" and cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["vocab_size"] == 151_936 and cfg["tie_word_embeddings"] is False
    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [151_645, 151_643]  # <|im_end|>, <|endoftext|>: two end tokens, as Qwen3-8B
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    # The embedding is larger than the tokenizer, as in the release (151,936 rows, 151,669 tokens).
    assert len(tok) == 151_669 < model.get_input_embeddings().weight.shape[0] == 151_936
    ids = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"])
    assert ids == [151_643, 151_644, 151_645, 151_667, 151_668]
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert 9e6 < sum(p.numel() for p in model.parameters()) < 11e6  # "about ten million parameters"


def test_the_qwen3_0_6b_shape_has_the_releases_752m_parameters_untied_and_a_bad_shape_is_named():
    import pytest
    import torch
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):  # shapes only: 752M parameters would take 3 GB here
        model = Qwen3ForCausalLM(release_model.model_config("qwen3-0.6b"))
    assert 751e6 < sum(p.numel() for p in model.parameters()) < 753e6  # issue 49's "752M parameters"
    assert model.lm_head.weight is not model.get_input_embeddings().weight
    with pytest.raises(ValueError, match="not one of release, qwen3-0.6b"):
        release_model.build("unused", shape="qwen3-8b")


def test_the_byte_level_bpe_round_trips_text_and_the_chat_template_has_the_thinking_switch(release_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(release_model, local_files_only=True)
    text = "copy : a b c d = a b c d, Wait: 3.5 ünïcode"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text and len(ids) < len(text)  # merges learnt, and bytes cover any text
    msgs = [{"role": "user", "content": "copy : a ="}]
    on = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    off = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert on == "<|im_start|>user\ncopy : a =<|im_end|>\n<|im_start|>assistant\n"
    assert off == on + "<think>\n\n</think>\n\n"


def test_the_builder_runs_as_a_command(tmp_path, capsys):
    assert release_model.main([str(tmp_path / "m"), "--seed", "1"]) == 0
    assert "model.path=" in capsys.readouterr().out and (tmp_path / "m" / "model.safetensors").is_file()
