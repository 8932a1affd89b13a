"""`streamrl eval`: pass@k and mean@k of a saved policy, or of a running learner's newest weights.

Offline: `streamrl eval RUN_DIR_OR_CHECKPOINT [key=value ...]` loads the checkpoint's
`policy.safetensors` (the newest complete one for a run dir) with the run's config.yaml (plus
overrides, e.g. `eval.samples=16` or `eval.sets={code: eval.jsonl, math: math.jsonl}`) and writes `eval.json`
into the run directory. It runs the shards the actors run during training (`streamrl.evaluation`), one after
another, so with the run's settings it repeats their numbers for the same version exactly.

Live: `streamrl eval --live [CONFIG_OR_RUN_DIR] [key=value ...] [--watch N]` subscribes to the
learner's weight channel as the peer "eval", like an actor that never sends groups, and evaluates
the newest weights, then each new version up to N evaluations in all (stopping early when the
learner shuts down). Each result goes to `eval.json` (the last) and `eval.jsonl` (all) in the run
directory. With `transport.curve_keys` the folder needs an `eval.key_secret` the learner admits.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from streamrl import config as config_lib
from streamrl.config import Config
from streamrl.commands import options
from streamrl.run import checkpoints, jsonfiles

# streamrl.evaluation and the rewards are imported where they run: they bring torch, and the command line builds its
# parser from this module.


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("eval", help="pass@k and mean@k of a saved policy, or (--live) of a running learner's")
    p.add_argument("args", nargs="*", help="RUN_DIR or checkpoint folder (with --live: CONFIG or RUN_DIR), "
                   "then key=value overrides (e.g. eval.samples=16)")
    p.add_argument("--live", action="store_true", help="subscribe to the learner's weights instead of a checkpoint")
    p.add_argument("--learner", default=None, help="--live: learner host (default: transport.host)")
    p.add_argument("--watch", type=int, default=1, help="--live: evaluate this many versions in all (default 1)")
    p.add_argument("--timeout", type=float, default=120.0, help="--live: seconds to wait for weights (default 120)")
    p.add_argument("--out", default=None, help="result file (default: RUN_DIR/eval.json)")


def main(args: argparse.Namespace) -> int:
    return options.tool(args, lambda: _main(args))


def _main(args: argparse.Namespace) -> int:
    path, overrides = options.split_args(args.args)
    out = Path(args.out) if args.out else None
    if not args.live:
        if path is None:
            raise config_lib.ConfigError("streamrl eval: give a RUN_DIR or checkpoint folder (or --live)")
        print(line(result := offline(path, overrides, out), out or options.run_dir(path) / "eval.json"))
        return 0 if result else 1
    options.at_least_one(args, "watch")
    return 0 if live(_live_config(path, overrides), args.learner, args.watch, args.timeout, out) else 1


def _live_config(path: str | None, overrides: list[str]) -> config_lib.Config:
    """A run dir's config.yaml (it holds the ports `streamrl run` chose), or a CONFIG file, or the default."""
    if path is not None and Path(path).is_dir():
        path = str(options.run_dir(path) / "config.yaml")
    return config_lib.load(path or str(config_lib.DEFAULT_CONFIG), overrides)


def offline(path: str | Path, overrides: list[str], out: Path | None = None) -> dict:
    """Evaluate the checkpoint at `path`; the result is written to `out` (default RUN_DIR/eval.json)."""
    from streamrl import evaluation
    from streamrl.tasks import rewards

    cfg = checkpoints.run_config(path, overrides)
    weights = checkpoints.checkpoint_of(path)  # the newest usable one: a damaged one is passed over, said
    evaluator = evaluation.Evaluator(cfg, rewards.build(cfg), *checkpoints.load_policy(cfg, path, weights))
    state = json.loads((weights.parent / checkpoints.STATE).read_text())
    result = {"checkpoint": str(weights), "step": state.get("step"), "policy_version": state.get("version"),
              **evaluator.run()}
    jsonfiles.write(out or checkpoints.run_dir_of(path) / "eval.json", result)
    return result


def live(cfg: Config, host: str | None, watch: int, timeout_s: float, out: Path | None = None, show=print) -> list[dict]:
    """Evaluate the learner's newest weights, then every new version, `watch` times in all (fewer if it stops)."""
    import zmq

    from streamrl import evaluation
    from streamrl.comm import security
    from streamrl.comm.control import Inbox
    from streamrl.comm.sockets import endpoint
    from streamrl.comm.weights.subscriber import WeightSubscriber
    from streamrl.tasks import rewards

    t, host = cfg.transport, host or cfg.transport.host
    out = out or cfg.run_path / "eval.json"
    evaluator = evaluation.Evaluator(cfg, rewards.build(cfg))
    ctx = zmq.Context()
    curve = security.actor_curve(t.curve_keys, "eval") if t.curve_keys else None
    inbox = Inbox(ctx, endpoint(host, t.weights_request_port), "eval", t.max_message_bytes, curve)
    sub = WeightSubscriber(ctx, endpoint(host, t.weights_port), inbox, t.max_message_bytes, curve)
    results, version = [], -1
    try:
        while len(results) < watch:
            got = sub.wait_for(version + 1, timeout_s, ask_first=not results)
            if got is None:  # the learner shut down (or asked actors for groups: not our business)
                if inbox.shutdown is not None:
                    break
                continue
            version = got[0]
            results.append({"policy_version": version, **evaluator.run(got[1])})
            jsonfiles.write(out, results[-1])
            with open(out.with_suffix(".jsonl"), "a") as f:
                f.write(jsonfiles.line(results[-1]))
            show(line(results[-1], out))
    finally:
        sub.close()
        inbox.close()
        ctx.term()
    return results


def line(result: dict, out: Path) -> str:
    """One line for the terminal: every eval/* number, the size and the time."""
    nums = "  ".join(f"{k.removeprefix('eval/')} {v:.3f}" for k, v in result.items() if k.startswith("eval/")
                     and k.rsplit("/", 1)[-1].startswith(("pass", "mean", "reward", "unparseable"))
                     and k.count("/") <= 1 + bool(set_names(result)))  # per set, not per category
    prompts = sum(v for k, v in result.items() if k.startswith("eval/") and k.endswith("/prompts")
                  and k.count("/") == 1 + bool(set_names(result)))
    return (f"streamrl eval: version {result.get('policy_version')}: {nums}  "
            f"({prompts} prompts x {result['eval/samples']} samples, {result['eval_s']:.2f}s) -> {out}")


def set_names(result: dict) -> list[str]:
    """The eval sets a result names (eval/<set>/prompts); [] for the task's own set (eval/prompts)."""
    return [] if "eval/prompts" in result else sorted(
        k.split("/")[1] for k in result if k.startswith("eval/") and k.count("/") == 2 and k.endswith("/prompts"))
