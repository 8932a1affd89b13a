"""Writes train.jsonl and eval.jsonl: chat prompts whose system message says which word of the user's
message to answer with (the first or the last); the `answer` column is what the reward compares with."""

import json
import random
import sys
from pathlib import Path

WORDS = ["red", "green", "blue", "black", "white", "pink"]
SYSTEM = {"first": "Answer with the first word.", "last": "Answer with the last word."}


def rows(n: int, seed: int) -> list[dict]:
    rng, out = random.Random(seed), []
    for _ in range(n):
        which, words = rng.choice(sorted(SYSTEM)), rng.sample(WORDS, 3)
        out.append({"prompt": [{"role": "system", "content": SYSTEM[which]},
                               {"role": "user", "content": " ".join(words)}],
                    "answer": words[0] if which == "first" else words[-1]})
    return out


if __name__ == "__main__":
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    for name, n, seed in (("train.jsonl", 400, 0), ("eval.jsonl", 32, 1)):
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows(n, seed)))
