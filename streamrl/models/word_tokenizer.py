"""The tiny default's tokenizer: one token per whitespace-separated word, made offline from the task's
vocabulary, over the `tokenizers` library alone.

transformers' PreTrainedTokenizerFast around the same `tokenizers.Tokenizer` cost 0.8-1.3 s to import
(transformers' package, its tokenization base, huggingface_hub), on every process's way to the first
step; `tokenizers` costs 0.02 s. This class is the part of PreTrainedTokenizerFast's surface streamrl
uses on the tiny job (call, encode, decode, the special tokens and their ids, len, convert_tokens_to_ids),
computed by the same backend the same way, so ids and text are the same (tests/unit/models/test_word_tokenizer.py
compares them with PreTrainedTokenizerFast over the task vocabularies). `to_transformers` gives that
PreTrainedTokenizerFast (exports to vLLM/SGLang folders, TRL); `save_pretrained` writes it.
"""

from __future__ import annotations

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>"]


class WordTokenizer:
    """Word-level tokenizer of `words` (after SPECIAL_TOKENS, repeats dropped): ids follow that order."""

    chat_template = None  # raw prompts: streamrl.models.prompting never applies a chat template to it
    pad_token, eos_token, bos_token, unk_token = SPECIAL_TOKENS

    def __init__(self, words: list[str]):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        self.vocab = {tok: i for i, tok in enumerate(dict.fromkeys([*SPECIAL_TOKENS, *words]))}
        tok = Tokenizer(models.WordLevel(vocab=self.vocab, unk_token=self.unk_token))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
        # As PreTrainedTokenizerFast registers them: matched whole in text, dropped by skip_special_tokens.
        tok.add_special_tokens(SPECIAL_TOKENS)
        self.backend_tokenizer = tok
        self.pad_token_id, self.eos_token_id, self.bos_token_id, self.unk_token_id = (
            self.vocab[t] for t in SPECIAL_TOKENS)

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text` (no template adds anything, with or without add_special_tokens)."""
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        """{"input_ids": ids, "attention_mask": ones} for one text, as PreTrainedTokenizerFast returns them."""
        if not isinstance(text, str):
            raise TypeError(f"WordTokenizer: one text (str) at a time, got {type(text).__name__}")
        ids = self.encode(text, add_special_tokens)
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """Text of `ids` (a list of ints, or an int), words joined by spaces."""
        return self.backend_tokenizer.decode([ids] if isinstance(ids, int) else list(ids),
                                             skip_special_tokens=skip_special_tokens)

    def batch_decode(self, rows, skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(r, skip_special_tokens) for r in rows]

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | list[int]:
        if isinstance(tokens, str):
            return self.vocab.get(tokens, self.unk_token_id)
        return [self.vocab.get(t, self.unk_token_id) for t in tokens]

    def to_transformers(self):
        """transformers' PreTrainedTokenizerFast of the same tokenizer (imports transformers)."""
        import copy

        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(tokenizer_object=copy.deepcopy(self.backend_tokenizer), pad_token=self.pad_token,
                                       eos_token=self.eos_token, bos_token=self.bos_token, unk_token=self.unk_token)

    def save_pretrained(self, folder: str) -> None:
        """Tokenizer files in Hugging Face layout (what a vLLM/SGLang folder holds)."""
        self.to_transformers().save_pretrained(folder)
