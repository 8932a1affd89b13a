"""A model folder shaped like a Qwen3 release, made offline: the CPU stand-in for a real checkpoint.

What it copies from a real Qwen3 release (Qwen/Qwen3-8B's files), so every code path that reads a
release runs on it: transformers' `Qwen3Config` / `Qwen3ForCausalLM` with an untied output layer,
`config.vocab_size` 151,936 while the tokenizer holds 151,669 tokens (the embedding has unused rows
past the tokenizer, as in the release), a byte-level BPE tokenizer whose special tokens sit at
Qwen3's ids (`<|endoftext|>` 151643, `<|im_start|>` 151644, `<|im_end|>` 151645, ... `<think>`
151667, `</think>` 151668), `<|im_end|>` as the tokenizer's EOS and `<|endoftext|>` as its pad, a
Qwen3-like chat template (Jinja; `enable_thinking=False` appends the empty think block), and a
`generation_config.json` with both end tokens (`eos_token_id: [151645, 151643]`).

What differs: about ten million random-init parameters (hidden 32, 2 layers; nearly all of them the
151,936-row embedding and output layer), and a BPE trained in milliseconds on a small built-in
text, its vocabulary padded with unreachable `<|reserved_i|>` entries up to Qwen3's first special id.

    python -m streamrl.models.release_model OUT_DIR [--seed 0] [--shape qwen3-0.6b]
    streamrl run model.path=OUT_DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

VOCAB_SIZE = 151_936
"""Rows of the embedding and output layer (Qwen3's config.vocab_size)."""
FIRST_SPECIAL_ID = 151_643
"""Qwen3's first special token id: the BPE vocabulary fills the ids below it."""

# Qwen3's added tokens in id order from 151643; the last four are not "special" in the release
# (they are kept when decoding with skip_special_tokens).
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]
NON_SPECIAL_ADDED = [
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
]
TOKENIZER_SIZE = FIRST_SPECIAL_ID + len(SPECIAL_TOKENS) + len(NON_SPECIAL_ADDED)  # 151,669 as in Qwen3

# Qwen3's chat format, written for this folder: the same markers, the generation prompt, the thinking switch
# (enable_thinking=false pre-fills an empty think block), tools in the system turn (`tools=`, Hermes' format),
# the model's <tool_call> blocks kept as it wrote them, tool results as <tool_response> blocks in a user turn,
# and Qwen3's history rule: an assistant turn after the last real user query keeps its <think> block when it has
# reasoning (the last one always shows one), an earlier one loses it.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- set content = message['content'] %}"
    "{%- if message['role'] == 'system' and tools and loop.first %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{%- set reasoning = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\\n' + content }}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

SHAPE = dict(hidden_size=32, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=64)
"""The decoder's size: ~10M parameters in all, 9.7M of them embedding and output layer; head_dim 64
because vLLM refuses smaller heads."""
SHAPES = {
    "release": SHAPE,
    # Qwen3-0.6B's decoder (its config.json), untied: 752M parameters, the GPU check's real-size model (issue 49).
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128),
}
"""`build`'s shapes by name: the CPU stand-in, and a release's size for measurements on a GPU."""


def _corpus() -> list[str]:
    """Training text for the BPE: the built-in tasks' prompts and answers, chat markup words, and
    some plain English, so the usual tasks tokenize into short sequences."""
    from streamrl import tasks

    letters = [chr(ord("a") + i) for i in range(26)]
    words = ["copy", "reverse", "repeat_first", ":", "=", "user", "assistant", "system", "think",
             "Wait, let me double-check that.", "Where might I have gone wrong this time? Let me double-check carefully.",
             "The answer is", "Rating", "A:", "B:", "boxed", "question", "response", "Which response is better?",
             "Solve the problem and put the final answer in \\boxed{}."]
    lines = [" ".join(letters), " ".join(str(d) for d in range(10)), *words]
    import random

    rng = random.Random(0)
    for name in ("copy", "reverse", "repeat_first"):
        task = tasks.TASKS.get(name)(num_symbols=26, length=8)
        for _ in range(200):
            p = task.sample(rng)
            lines.append(f"{p.text} {' '.join(p.target)}")
    return lines * 4


def build_tokenizer(bpe_vocab: int = 2000):
    """A PreTrainedTokenizerFast with Qwen3's special tokens at Qwen3's ids and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    small = Tokenizer(models.BPE())
    small.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    small.train_from_iterator(_corpus(), trainers.BpeTrainer(
        vocab_size=bpe_vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    state = json.loads(small.to_str())["model"]
    vocab: dict[str, int] = dict(state["vocab"])
    # Fill the ids up to Qwen3's first special id with entries no merge can produce, so the special
    # tokens land at the release's ids and the tokenizer has the release's length.
    vocab.update({f"<|reserved_{i}|>": i for i in range(len(vocab), FIRST_SPECIAL_ID)})
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in NON_SPECIAL_ADDED])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   model_max_length=131072, clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def model_config(shape: str = "release"):
    """The folder's `Qwen3Config` at one of SHAPES (untied, Qwen3's vocabulary, rope and end tokens)."""
    from transformers import Qwen3Config

    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r}: not one of {', '.join(SHAPES)}")
    return Qwen3Config(
        vocab_size=VOCAB_SIZE, max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
        tie_word_embeddings=False, bos_token_id=FIRST_SPECIAL_ID, eos_token_id=FIRST_SPECIAL_ID + 2,  # <|im_end|>
        torch_dtype="float32", **SHAPES[shape])


def build(out: str | Path, seed: int = 0, shape: str = "release") -> Path:
    """Write the folder (config.json, generation_config.json, model.safetensors, tokenizer files) to `out`; `shape`
    names one of SHAPES."""
    import torch
    from transformers import GenerationConfig, Qwen3ForCausalLM

    config = model_config(shape)  # a bad shape is refused before anything is written
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "</think>")}
    assert ids["<|endoftext|>"] == FIRST_SPECIAL_ID and ids["</think>"] == TOKENIZER_SIZE - 1, ids
    assert len(tokenizer) == TOKENIZER_SIZE, len(tokenizer)
    assert (config.bos_token_id, config.eos_token_id) == (ids["<|endoftext|>"], ids["<|im_end|>"]), ids
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"], pad_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        do_sample=True, temperature=0.6, top_k=20, top_p=0.95)  # Qwen3-8B's generation_config.json
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m streamrl.models.release_model", description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="folder to write")
    p.add_argument("--seed", type=int, default=0, help="weight initialisation seed (default 0)")
    p.add_argument("--shape", choices=list(SHAPES), default="release",
                   help="the decoder's size: release (~10M parameters, CPU) or qwen3-0.6b (752M, for a GPU)")
    args = p.parse_args(argv)
    out = build(args.out, args.seed, args.shape)
    n = sum(1 for _ in out.iterdir())
    print(f"wrote a Qwen3-shaped model folder ({n} files, vocab {VOCAB_SIZE}, tokenizer {TOKENIZER_SIZE}) to {out}; "
          f"train it with: streamrl run model.path={out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
