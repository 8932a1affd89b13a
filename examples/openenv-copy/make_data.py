"""Writes train.jsonl: every copy prompt over 4 symbols of length 4, its `target` the symbols to write back
(handed to the environment's reset as its `target` keyword)."""

import itertools
import json
import sys
from pathlib import Path

if __name__ == "__main__":
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    rows = [{"prompt": f"copy : {' '.join(s)} =", "target": " ".join(s)} for s in itertools.product("abcd", repeat=4)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
