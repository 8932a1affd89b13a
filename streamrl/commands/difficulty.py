"""`streamrl difficulty`: offline difficulty filtering (see `streamrl.algo.difficulty` for the rule).

Samples N rollouts per prompt with the initial (or a saved) policy and writes the prompts whose
success rate lies in [difficulty.low, difficulty.high]. Prompts are encoded, capped and refused as the
actors do (`streamrl.models.prompting`): a completion is cut where its prompt's room under
`model.max_seq_len` ends, and a prompt that leaves no room (or is longer than `model.max_prompt_tokens`)
is not sampled, not written, and counted (`too_long`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from streamrl import config as config_lib
from streamrl.config import Config
from streamrl.algo.difficulty import in_band
from streamrl.commands import options


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("difficulty", help="keep the prompts whose success rate lies in [difficulty.low, .high]")
    options.add_config(p)
    p.add_argument("--out", required=True, help="JSONL to write: the kept dataset rows (or prompt ids)")
    p.add_argument("--rollouts", type=int, default=None, help="samples per prompt (default: difficulty.rollouts)")
    p.add_argument("--checkpoint", default=None, help="run dir or checkpoint folder (default: the initial policy)")
    p.add_argument("--prompts", type=int, default=None,
                   help="tasks without a dataset: how many eval_set prompts (default: eval.prompts)")


def main(args: argparse.Namespace) -> int:
    return options.tool(args, lambda: _main(args))


def _main(args: argparse.Namespace) -> int:
    path, overrides = options.split_args(args.args)
    if path is None and args.checkpoint:
        path = str(options.run_dir(args.checkpoint) / "config.yaml")
    cfg = config_lib.load(path or str(config_lib.DEFAULT_CONFIG), overrides)
    options.at_least_one(args, "rollouts", "prompts")
    c = filter_offline(cfg, args.rollouts or cfg.difficulty.rollouts, Path(args.out), args.checkpoint, args.prompts)
    print(f"streamrl difficulty: kept {c['kept']} of {c['prompts']} prompts ({c['source']}); dropped "
          f"{c['too_easy']} too easy (rate > {cfg.difficulty.high}), {c['too_hard']} too hard "
          f"(rate < {cfg.difficulty.low}), {c['too_long']} too long (no room under model.max_seq_len, or "
          f"over model.max_prompt_tokens: not sampled) -> {c['out']}")
    return 0


def filter_offline(cfg: Config, rollouts: int, out: Path, checkpoint: str | Path | None = None,
                   prompts: int | None = None) -> dict:
    """Sample `rollouts` per prompt, write the kept ones to `out`; returns the counts."""
    from streamrl import evaluation
    from streamrl.models import model as model_lib
    from streamrl.models import prompting
    from streamrl.run import checkpoints
    from streamrl.tasks import rewards
    from streamrl.tasks.base import RowsTask, optional

    reward = rewards.build(cfg)
    task = reward.task
    if checkpoint is not None:
        model, tokenizer = checkpoints.load_policy(cfg, checkpoint)
    else:
        model, tokenizer = model_lib.build(cfg, task.vocabulary)
    rows = task.train if cfg.task.data and isinstance(task, RowsTask) else None
    items = [task.prompt(ex) for ex in rows] if rows else task.eval_set(prompts or cfg.eval.size, cfg.eval.seed)
    a = cfg.actors
    # prompts as the actors encode them (the chat template where the model has one): the success rate is theirs
    encode = prompting.PromptEncoder.from_config(cfg, tokenizer)
    ids = [encode(p) for p in items]
    fits = [i for i, p_ids in enumerate(ids) if encode.room(p_ids) > 0]
    table = evaluation.sample_rewards(model.eval(), tokenizer, reward, [items[i] for i in fits], rollouts,
                                      temperature=a.temperature, max_new_tokens=a.max_new_tokens, seed=cfg.seed,
                                      encode=encode, caps=[encode.room(ids[i]) for i in fits])
    r_min, d = cfg.advantage.r_min_correct, cfg.difficulty
    rates: dict[int, float] = {i: sum(r >= r_min for r in row) / len(row) for i, row in zip(fits, table)}
    kept = [i for i, rate in rates.items() if in_band(rate, d.low, d.high)]
    out.parent.mkdir(parents=True, exist_ok=True)
    if rows:
        from streamrl.tasks import data

        # task.train holds the usable rows in file order; `numbers` says which source row each one is
        numbers = data.read(cfg.task.data, optional(task, "row_converter")(cfg.task), cfg.task.max_row_bytes).numbers
        raw = dict(data.raw_rows(cfg.task.data, cfg.task.max_row_bytes)[0])
        out.write_text("".join(json.dumps(raw[numbers[i]], default=str) + "\n" for i in kept))
    else:
        out.write_text("".join(json.dumps({"id": items[i].id, "text": items[i].text, "success_rate": rates[i]}) + "\n"
                               for i in kept))
    return {"prompts": len(items), "kept": len(kept), "too_easy": sum(r > d.high for r in rates.values()),
            "too_hard": sum(r < d.low for r in rates.values()), "too_long": len(items) - len(fits),
            "source": "task.data rows" if rows else "task.eval_set",
            "out": str(out)}
