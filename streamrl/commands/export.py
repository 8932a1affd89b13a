"""`streamrl export`: a checkpoint as a Hugging Face model folder (`streamrl.run.export`)."""

from __future__ import annotations

import argparse
import sys

from streamrl import config as config_lib


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("export", help="a checkpoint as a Hugging Face model folder (transformers, vllm serve)")
    p.add_argument("run", metavar="RUN_DIR", help="runs/<name>, or one checkpoint folder runs/<name>/checkpoints/<tag>")
    p.add_argument("out", metavar="OUT", help="folder to write (must not exist)")
    p.add_argument("--step", type=int, default=None, help="the checkpoint at this step (default: the newest complete)")
    p.add_argument("--merge", action="store_true",
                   help="LoRA: merge the adapters into the base weights (a full-weight checkpoint is already merged)")
    p.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard (default 5GB)")


def main(args: argparse.Namespace) -> int:
    from streamrl.run import export

    try:
        done = export.export(args.run, args.out, args.step, args.merge, export.parse_size(args.max_shard_size))
    except (export.ExportError, config_lib.ConfigError) as e:
        print(f"streamrl export: error: {e}", file=sys.stderr)
        return 2
    print(f"streamrl export: wrote step {done.step} ({done.kind} model, {done.parameters:,} parameters, "
          f"{len(done.shards)} shard(s)) from {done.checkpoint} to {done.out}; load it with "
          f"AutoModelForCausalLM.from_pretrained({str(done.out)!r}) or `vllm serve {done.out}`")
    return 0
