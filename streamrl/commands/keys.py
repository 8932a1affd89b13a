"""`streamrl keys`: CurveZMQ key pairs for the learner and N actors (`streamrl.comm.security`)."""

from __future__ import annotations

import argparse
import sys


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("keys", help="make CurveZMQ key pairs for the learner and N actors")
    p.add_argument("directory", help="folder to write (learner.key*, actor-<i>.key*, authorized/)")
    p.add_argument("--actors", type=int, default=2, help="how many actor key pairs (default 2)")
    p.add_argument("--force", action="store_true",
                   help="replace keys already in DIR (every old key, and every old authorized actor, goes)")


def main(args: argparse.Namespace) -> int:
    from streamrl.comm import security

    try:
        made = security.make_keys(args.directory, args.actors, force=args.force)
    except (ValueError, OSError) as e:
        print(f"streamrl keys: error: {e}", file=sys.stderr)
        return 2
    print(f"streamrl: wrote {len(made)} key files to {args.directory}/ (secret keys are *.key_secret, mode 600); "
          f"run learner and actors with transport.curve_keys={args.directory}")
    return 0
