"""How many positions the model has, and the cap on prompt + completion tokens that follows from it.

The rule (docs/bring-your-own-task.md, "How rows are checked"): a sequence is at most `model.max_seq_len`
tokens, prompt and completion together, and with `model.max_seq_len` unset at most the model's positions (the
tiny model's `model.context`; a folder's `max_position_embeddings`; a hub id that is not in a local folder is
not read here, and its engine applies its own). A prompt that leaves no room for one completion token is
skipped before generation and counted (`prompts_too_long`); a completion is cut at
min(actors.max_new_tokens, cap - prompt tokens). A config whose completion cap alone fills the model's
positions could never generate, and is refused before anything starts (`problems`).
"""

from __future__ import annotations

import json
from pathlib import Path


def positions(model_cfg) -> tuple[int, str] | None:
    """(the model's positions, where that figure comes from), or None when it is not known here."""
    if not model_cfg.path:
        return model_cfg.context, "model.context"
    config = Path(model_cfg.path).expanduser() / "config.json"
    try:
        raw = json.loads(config.read_text())
    except (OSError, ValueError):
        return None  # a hub id, or a folder path_problem refuses on its own
    for part in (raw, raw.get("text_config") or {}):  # a multimodal release keeps its language model's inside
        if isinstance(n := part.get("max_position_embeddings"), int) and n > 0:
            return n, f"max_position_embeddings in {config}"
    return None


def seq_cap(model_cfg) -> int | None:
    """Most tokens of prompt + completion: model.max_seq_len, else the model's positions (None: not known)."""
    if model_cfg.max_seq_len:
        return model_cfg.max_seq_len
    known = positions(model_cfg)
    return known[0] if known else None


def problems(cfg) -> list[str]:
    """A cap at or beyond the model's positions, one line each: model.max_seq_len above them, and a completion
    cap (actors.max_new_tokens, eval.max_new_tokens) that leaves no room for a prompt token."""
    known = positions(cfg.model)
    if known is None:
        return []
    n, where = known
    out = []
    if cfg.model.max_seq_len and cfg.model.max_seq_len > n:
        out.append(f"model.max_seq_len={cfg.model.max_seq_len}: the model has {n} positions ({where}); "
                   f"give at most {n}")
    cap, cap_name = (cfg.model.max_seq_len, "model.max_seq_len") if cfg.model.max_seq_len else (n, where)
    for name, value in (("actors.max_new_tokens", cfg.actors.max_new_tokens), ("eval.max_new_tokens",
                                                                              cfg.eval.max_new_tokens)):
        if value and value >= min(cap, n):
            room = f"{cap_name}={cap}" if cap < n else f"the model has {n} positions ({where})"
            out.append(f"{name}={value}: {room}, prompt and completion together; give at most {min(cap, n) - 1} "
                       "so a prompt token fits")
    return out
