"""`streamrl bench`: hot-path benchmarks, each reported as a ratio against a reference measured in
the same run (never a bare time).

Each lives in a module of this package, named for it (transport, advantages and batching in groups.py).

- transport: ScoredGroup encode → PUSH → PULL → decode + validate, process to process over
  loopback TCP, against raw ZeroMQ moving the same bytes (one frame per message, no codec); and
  groups whose every 4th token is an environment token (a model-token mask) and with 4 turns a sample against the
  same groups without either; and the codec in process on those groups against them without their turns.
- weights: WeightPublisher → 2 WeightSubscriber processes, a version in chunks (2 GB in the full run), against
  raw PUB/SUB of the same bytes in the same chunks; the learner's blocked share of the transfer; and, with no step
  between publish and settle, its blocked time with a host copy first against sending from the parameters.
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
- agents: a two-turn agent episode on the openai client against the same task as an environment episode, per
  episode, with where the agent's time goes (agents.py).
- learner: the learner's step at release shape (151,936 vocabulary) against plain torch (learner.py).
- proximal: decoupled_ppo's minibatch steps with A-3PO's interpolated proximal log-probs against the proximal
  forward pass (proximal.py).
- delta: delta weight versions on real steps at lr 1e-6, release shape: fraction changed, bytes and time per
  version against full versions (delta.py).
- trl (optional, only when named; needs TRL): wall time to the same mean reward as TRL's GRPOTrainer.
- soak (optional, only when named): the default job for STREAMRL_SOAK_STEPS steps (20,000; --short 300), each
  process's RSS slope per 1,000 steps against its own RSS after warm-up (soak.py).
- staleness (optional, only when named; a sweep of many training runs): final-policy reward at forced lags, per
  loss objective, as a ratio of strict's (staleness.py; its options are the `sweeps` group below).
- stability (optional, only when named; hours): the whole tiny job for 5,000 steps per objective and seed, what
  each run kept of its peak rolling reward (stability.py).
- time-to-target (optional, only when named): the whole tiny job at each max_staleness, wall time to a reward
  target against the default max_staleness's (time_to_target.py).
- admission (optional, only when named): whole runs of the staleness bench's tasks at each max_staleness, the final
  policy's reward against strict runs', with the lag the actors ran at (admission.py).
- host-copy (optional, only when named; root): whole runs over network namespaces whose links are slower than the
  learner's step, each version sent from the parameters against from a host copy, per max_staleness (host_copy.py).
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
           "proximal": ("proximal", "proximal"),
           "dealer": ("dealer", "dealer"), "endpoint": ("endpoint", "endpoint"),
           "agents": ("agents", "agents")}
# never part of a plain `streamrl bench`: trl needs TRL installed; soak runs for hours at its full length;
# staleness trains dozens of runs (minutes to hours)
OPTIONAL = {"trl": ("trl", "trl"), "soak": ("soak", "soak"), "staleness": ("staleness", "staleness"),
            "stability": ("stability", "stability"), "time-to-target": ("time_to_target", "time_to_target"),
            "admission": ("admission", "admission"), "host-copy": ("host_copy", "host_copy")}
SWEEPS = ("staleness", "stability", "time-to-target", "admission", "host-copy")  # those that take the `sweeps` options
OPTIONED = (*SWEEPS, "learner")  # the benches given the command's options their function takes (learner: --shape)


def names() -> list[str]:
    return [*BENCHES, *OPTIONAL]


def bench(name: str):
    module, function = BENCHES.get(name) or OPTIONAL[name]
    return getattr(import_module(f"streamrl.bench.{module}"), function)


def run(names: list[str], short: bool, sweeps: dict | None = None) -> list[dict]:
    """sweeps: the options of the benches in OPTIONED (objectives, lags, seeds, steps, shape, ...), each given the
    ones it takes."""
    import inspect
    import os

    rows = []
    env = dict(os.environ)
    for name in names or list(BENCHES):
        takes = inspect.signature(bench(name)).parameters if name in OPTIONED else {}
        options = {k: v for k, v in (sweeps or {}).items() if v is not None and k in takes}
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
                        "(memory over STREAMRL_SOAK_STEPS steps, 20,000 by default), staleness (reward against "
                        "forced lag: many training runs), stability (5,000-step runs), time-to-target "
                        "(max_staleness against wall time to a reward), admission (max_staleness against the "
                        "final policy's reward, whole runs) and host-copy (weights sent from a host copy over slow "
                        "links; root)")
    p.add_argument("--short", action="store_true", help="a quick pass that proves the benchmarks run")
    from streamrl.models.release_model import SHAPES  # plain data: the module imports torch only when it builds

    p.add_argument("--shape", choices=list(SHAPES),
                   help="learner: the decoder's size (default: the release folder's; qwen3-0.6b: 752M parameters, "
                        "for a GPU)")
    s = p.add_argument_group("sweeps", "options of staleness, stability and time-to-target, each taking those "
                                       "that apply to it (docs/reference/benchmarks.md)")
    s.add_argument("--objectives", nargs="+", metavar="LOSS",
                   help="each a loss.name, NAME@KEY=VALUE[@KEY=VALUE...] (that loss with those overrides), or a "
                   "named variant: decoupled_ppo-2step, decoupled_ppo-4step, tis-cap1, token_pg-wide, token_pg-4step "
                   "(default: token_pg; stability: the default loss)")
    s.add_argument("--lags", nargs="+", type=int, metavar="K", help="forced lags (default: 0 1 2 4 8 16 32)")
    s.add_argument("--seeds", type=int, help="seeds per setting (default: 3)")
    s.add_argument("--steps", type=int, help="learner steps per run (default: staleness 300, stability 5000, "
                                             "time-to-target 600, admission 300)")
    s.add_argument("--tasks", nargs="+", metavar="TASK", help="reverse (default; admission: reverse, chat-dataset and "
                                                             "copy-long), copy, copy-long, chat-dataset")
    s.add_argument("--jobs", type=int, help="runs at once (staleness: one torch thread each, default 2; stability, "
                                            "time-to-target, admission: default as many as --cores-per-run allows)")
    s.add_argument("--cores-per-run", type=int, dest="cores_per_run",
                   help="stability, time-to-target, admission: cores pinned to each whole run (default: 2)")
    s.add_argument("--max-staleness", nargs="+", type=int, dest="values", metavar="K",
                   help="time-to-target: the max_staleness values (default: 1 2 4 8, and the default's); "
                        "admission: those besides strict (default: 2 8 16); host-copy: default 2 4 8")
    s.add_argument("--target", type=float, help="time-to-target: the reward target (default: 0.75)")
    s.add_argument("--timeout", type=float, dest="timeout_s", metavar="S",
                   help="stability, time-to-target, admission: stop a run after S seconds and report the steps it "
                        "made")
    s.add_argument("--out", metavar="DIR", help="write DIR/staleness.json (every run) and DIR/staleness.png")
    s.add_argument("--set", nargs="+", dest="overrides", metavar="KEY=VALUE", help="config overrides for every run")


def main(args: argparse.Namespace) -> int:
    run(args.names, short=args.short, sweeps={k: getattr(args, k) for k in (
        "objectives", "lags", "seeds", "steps", "tasks", "jobs", "out", "overrides", "cores_per_run", "values",
        "target", "timeout_s", "shape")})
    return 0
