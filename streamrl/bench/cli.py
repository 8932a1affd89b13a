"""`streamrl bench`: hot-path benchmarks, each reported as a ratio against a reference measured in
the same run (never a bare time).

Each lives in a module of this package, named for it (transport, advantages and batching in groups.py).

- transport: ScoredGroup encode → PUSH → PULL → decode + validate, process to process over
  loopback TCP, against raw ZeroMQ moving the same bytes (one frame per message, no codec); and
  groups whose every 4th token is an environment token (a model-token mask) against the same groups
  without one.
- weights: WeightPublisher → 2 WeightSubscriber processes, a version in chunks (2 GB in the full run), against
  raw PUB/SUB of the same bytes in the same chunks; and the learner's blocked share of the transfer.
- overlap: the tiny job strict vs async, against the ideal overlap bound from the strict run's timings.
- advantages: `advantages.compute(..., "corpo")` against the bare tensor expression it wraps.
- batching: the learner's collate (16 groups → padded tensors) against copying the same bytes.
- startup: `streamrl run` to the first learner step, by phase, against fresh-interpreter children
  and bare imports (startup.py).
- generate: the hf actor's lean sampling loop against transformers' `generate` (generate.py).
- episodes: multi-turn episodes with a tool that sleeps 50 ms against single-turn sampling of the same tokens
  (episodes.py).
- dealer: dealing a dataset's prompts (task.epochs) against drawing them with replacement, per prompt in process
  and in groups/s of the same tiny dataset run (dealer.py).
- endpoint: the actor's OpenAI-compatible endpoint (agent episodes) against calling its engine directly, per
  request, one at a time and sixteen at a time (endpoint.py).
- learner: the learner's step at release shape (151,936 vocabulary) against plain torch (learner.py).
- delta: delta weight versions on real steps at lr 1e-6, release shape: fraction changed, bytes and time per
  version against full versions (delta.py).
- trl (optional, only when named; needs TRL): wall time to the same mean reward as TRL's GRPOTrainer.
- soak (optional, only when named): the default job for STREAMRL_SOAK_STEPS steps (20,000; --short 300), each
  process's RSS slope per 1,000 steps against its own RSS after warm-up (soak.py).
- staleness (optional, only when named; a sweep of many training runs): final-policy reward at forced lags, per
  loss objective, as a ratio of strict's (staleness.py; its options are the `staleness` group below).
"""

from __future__ import annotations

import argparse
from importlib import import_module

# name -> the module holding the bench and its function; imported only when the bench runs, so the command line
# reads the names without numpy, torch or TRL.
BENCHES = {"transport": ("groups", "transport"), "weights": ("weights", "weights"), "overlap": ("overlap", "overlap"),
           "advantages": ("groups", "advantages_bench"), "batching": ("groups", "batching"),
           "learner": ("learner", "learner"), "generate": ("generate", "generate"),
           "episodes": ("episodes", "episodes"), "startup": ("startup", "startup"), "delta": ("delta", "delta"),
           "dealer": ("dealer", "dealer"), "endpoint": ("endpoint", "endpoint")}
# never part of a plain `streamrl bench`: trl needs TRL installed; soak runs for hours at its full length;
# staleness trains dozens of runs (minutes to hours)
OPTIONAL = {"trl": ("trl", "trl"), "soak": ("soak", "soak"), "staleness": ("staleness", "staleness")}


def names() -> list[str]:
    return [*BENCHES, *OPTIONAL]


def bench(name: str):
    module, function = BENCHES.get(name) or OPTIONAL[name]
    return getattr(import_module(f"streamrl.bench.{module}"), function)


def run(names: list[str], short: bool, staleness: dict | None = None) -> list[dict]:
    """staleness: the staleness bench's options (objectives, lags, seeds, steps, tasks, jobs, out), given only to it."""
    import os

    rows = []
    env = dict(os.environ)
    for name in names or list(BENCHES):
        options = {k: v for k, v in (staleness or {}).items() if v is not None} if name == "staleness" else {}
        try:
            for row in bench(name)(short=short, **options):
                print("  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                      flush=True)
                rows.append(row)
        finally:  # each bench starts from the command's environment: an in-process engine (learner) sets RANK,
            os.environ.clear()  # MASTER_PORT..., whose port a later bench's learner process must not reuse
            os.environ.update(env)
    return rows


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench", help="hot-path benchmarks, as ratios against same-run references")
    p.add_argument("names", nargs="*", choices=[*names(), []],
                   help="default: all but trl (streamrl against TRL's GRPOTrainer; needs `pip install trl`), soak "
                        "(memory over STREAMRL_SOAK_STEPS steps, 20,000 by default) and staleness (reward against "
                        "forced lag: many training runs)")
    p.add_argument("--short", action="store_true", help="a quick pass that proves the benchmarks run")
    s = p.add_argument_group("staleness", "the staleness bench's sweep (docs/reference/benchmarks.md)")
    s.add_argument("--objectives", nargs="+", metavar="LOSS",
                   help="each a loss.name, NAME@KEY=VALUE[@KEY=VALUE...] (that loss with those overrides), or a "
                   "named variant: decoupled_ppo-2step, decoupled_ppo-4step, tis-cap1, token_pg-wide, token_pg-4step "
                   "(default: token_pg)")
    s.add_argument("--lags", nargs="+", type=int, metavar="K", help="forced lags (default: 0 1 2 4 8 16 32)")
    s.add_argument("--seeds", type=int, help="seeds per setting (default: 3)")
    s.add_argument("--steps", type=int, help="learner steps per run (default: 300)")
    s.add_argument("--tasks", nargs="+", metavar="TASK", help="reverse (default), copy, chat-dataset")
    s.add_argument("--jobs", type=int, help="runs at once, one torch thread each (default: 2)")
    s.add_argument("--out", metavar="DIR", help="write DIR/staleness.json (every run) and DIR/staleness.png")
    s.add_argument("--set", nargs="+", dest="overrides", metavar="KEY=VALUE", help="config overrides for every run")


def main(args: argparse.Namespace) -> int:
    run(args.names, short=args.short, staleness={k: getattr(args, k) for k in (
        "objectives", "lags", "seeds", "steps", "tasks", "jobs", "out", "overrides")})
    return 0
