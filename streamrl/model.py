"""Builds the policy model and tokenizer the same way on the learner and on every actor.

With `model.path` unset this is the tiny CPU default: a random-init Llama sized by the config and
a word-level tokenizer made offline from the task's vocabulary, so nothing is downloaded.
Actors replace the random weights with the learner's before they generate anything.
"""

from __future__ import annotations

from pathlib import Path

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>"]


def build_tokenizer(words: list[str]):
    """A PreTrainedTokenizerFast with one token per word (whitespace-split), made offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(dict.fromkeys([*SPECIAL_TOKENS, *words]))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>"
    )


def build(cfg, task_words: list[str] | None = None):
    """(model, tokenizer) for `cfg` (a streamrl Config). Model weights are seeded by cfg.seed."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    dtype = getattr(torch, cfg.model.dtype)
    if cfg.model.path:
        path = Path(cfg.model.path)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    else:
        if task_words is None:
            from streamrl import tasks

            task_words = tasks.build(cfg.task).vocabulary
        if cfg.mgrpo.enabled:  # layer-2 queries hold a guiding phrase
            from streamrl.mgrpo import phrase_words

            task_words = [*task_words, *phrase_words(cfg.mgrpo.phrases)]
        tokenizer = build_tokenizer(task_words)
        m = cfg.model
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=m.hidden_size,
            intermediate_size=m.intermediate_size,
            num_hidden_layers=m.num_layers,
            num_attention_heads=m.num_heads,
            num_key_value_heads=m.num_heads,
            max_position_embeddings=256,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            tie_word_embeddings=False,
        )
        with torch.random.fork_rng():
            torch.manual_seed(cfg.seed)
            model = LlamaForCausalLM(config).to(dtype)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def vocab_size(model) -> int:
    return int(model.get_input_embeddings().weight.shape[0])
