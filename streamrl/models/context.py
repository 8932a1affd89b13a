"""How many positions the model has, and the cap on prompt + completion tokens that follows from it.

The rule (docs/guides/bring-your-own-task.md, "How rows are checked"): a sequence is at most `model.max_seq_len`
tokens, prompt and completion together, and with `model.max_seq_len` unset at most the model's positions (the
tiny model's `model.context`; a folder's `max_position_embeddings`; a hub id that is not in a local folder is
not read here, and its engine applies its own). A prompt that leaves no room for one completion token is
skipped before generation and counted (`prompts_too_long`); a completion is cut at
min(actors.max_new_tokens, cap - prompt tokens). A model.max_seq_len above the model's positions, or (without
it) a completion cap that alone fills them, is refused before anything starts (`problems`).
"""

from __future__ import annotations

import json
from pathlib import Path

from streamrl.config import Config


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


def problems(cfg: Config) -> list[str]:
    """Caps beyond the model's positions, one line each: model.max_seq_len above them; with model.max_seq_len
    unset, a completion cap (actors.max_new_tokens, eval.max_new_tokens) that leaves no room for a prompt token.
    (With model.max_seq_len set, it bounds prompt + completion, and a completion cap as large is allowed: the
    paper's recipes set both to 16,384.)"""
    known = positions(cfg.model)
    if known is None:
        return []
    n, where = known
    if cfg.model.max_seq_len:
        return [] if cfg.model.max_seq_len <= n else [
            f"model.max_seq_len={cfg.model.max_seq_len}: the model has {n} positions ({where}); give at most {n}"]
    return [f"{name}={value}: the model has {n} positions ({where}), prompt and completion together; give at most "
            f"{n - 1} so a prompt token fits, or set model.max_seq_len"
            for name, value in (("actors.max_new_tokens", cfg.actors.max_new_tokens),
                                ("eval.max_new_tokens", cfg.eval.max_new_tokens)) if value and value >= n]
