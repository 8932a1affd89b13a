"""`streamrl samples RUN [--step N] [--best|--worst]`: what the model wrote, from the run's samples.jsonl.

The learner keeps samples of its batches every `log.samples_every` steps (streamrl.learner.samples), in
samples.jsonl and the parts rotated out of it (streamrl.run.samples_files), read here in order. Without
--step this prints the newest logged step's; --best/--worst rank the samples (of that step, or of every logged
step without --step) by reward, then advantage. An episode prints turn by turn, each turn's role before its text
(the model's turns marked `▶`), with its counts of turns by role and of tool calls. Texts the model or a peer wrote
are printed with every control character escaped (written as `\\x1b`, `\\r`, `\\u202e`): a completion cannot
move the cursor, colour or retitle the terminal.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from pathlib import Path

from streamrl.run import samples_files
from streamrl.run.samples_files import FILE

# C0 and C1 controls but newline and tab (ESC starts ANSI sequences, CR rewrites the line, 0x9b is a one-byte CSI),
# and the bidirectional overrides that make text read otherwise than it is stored.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("samples", help="what the model wrote: samples of a run's batches, readably")
    p.add_argument("run", metavar="RUN", help="the run directory (run_dir/name), or its samples.jsonl")
    p.add_argument("--step", type=int, default=None, help="the logged step to show (default: the newest)")
    rank = p.add_mutually_exclusive_group()
    rank.add_argument("--best", action="store_true", help="highest reward first (every logged step without --step)")
    rank.add_argument("--worst", action="store_true", help="lowest reward first (every logged step without --step)")
    p.add_argument("--limit", type=int, default=16, help="most samples to print (default 16)")
    p.add_argument("--width", type=int, default=100, help="wrap texts at this many characters (default 100)")


def load(run: str | Path) -> list[dict]:
    """Every record of a run's samples log (every part, oldest first: RUN is the run directory or its samples.jsonl;
    another file is read alone); ValueError naming what is missing."""
    path = Path(run)
    files = samples_files.parts(path.parent if path.name == FILE else path) if path.is_dir() or path.name == FILE \
        else [path] if path.is_file() else []
    if not files:
        where = path / FILE if path.is_dir() else path
        raise ValueError(f"{where}: no samples log (the learner writes it every log.samples_every steps; "
                         "log.samples_every=0 turns it off)")
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]


def safe(text) -> str:
    """`text` with its control characters escaped (newline and tab kept): safe to print to a terminal."""
    return _CONTROL.sub(lambda m: ascii(m.group())[1:-1], str(text))


def choose(records: list[dict], step: int | None, best: bool, worst: bool) -> list[dict]:
    """The records to print: one step's (the newest by default, or `step`; ValueError listing the logged steps when
    it was not logged), or with best/worst and no step every step's, ranked by reward then advantage."""
    steps = sorted({r["step"] for r in records})
    if not steps:
        raise ValueError("the samples log is empty (no logged step yet)")
    if step is not None and step not in steps:
        shown = ", ".join(map(str, steps[:10])) + (", ..." if len(steps) > 10 else "")
        raise ValueError(f"--step {step}: not logged; logged steps: {shown} (every log.samples_every)")
    if step is None and not (best or worst):
        step = steps[-1]
    chosen = [r for r in records if step is None or r["step"] == step]
    if best or worst:
        chosen.sort(key=lambda r: (r["reward"], r["advantage"]), reverse=best)
    return chosen


def render(records: list[dict], width: int = 100) -> str:
    """Readable text: each prompt once per group, then each sample's reward, advantage, lag and completion."""
    out, last = [], None
    for r in records:
        key = (r["step"], r["group"])
        if key != last:
            out.append(f"step {r['step']}  group {r['group']}  {safe(r['prompt_id'])}  (from {safe(r['actor'])}, "
                       f"policy version {r['policy_version']}, lag {r['lag']})")
            out.append(textwrap.indent(textwrap.fill(safe(r["prompt"]) or "(empty)", width), "  prompt: "))
            last = key
        out.append(f"  reward {r['reward']:.3f}  A {r['advantage']:+.3f}  {safe(r['finish_reason']):<6} {r['tokens']} "
                   "tokens"
                   + ("" if r.get("scored", True) else "  UNSCORED (a user's function failed on it; its group's mean "
                                                       "stands in)"))
        if parts := r.get("rewards_by_function"):
            out.append("    by function: " + ", ".join(f"{safe(k)} {_value(v)}" for k, v in parts.items()))
        calls = ", ".join(f"{safe(k)} ×{n}" for k, n in sorted(r.get("tool_calls", {}).items())) or "none"
        if turns := r.get("conversation"):
            out.append(f"    {_counts(turns)}; tool calls: {calls}")
            out.extend(_turns(turns, width))
            continue
        if "turns" in r:  # an episode logged before its turns were
            out.append(f"    {r['turns']} turns, tool calls: {calls}")
        out.append(textwrap.indent(textwrap.fill(safe(r["completion"]) or "(empty)", width), "    | "))
    return "\n".join(out) + "\n"


def _counts(turns: list[dict]) -> str:
    """'2 model turns, 1 environment turn, 0 tool turns'."""
    n = {role: sum(t["role"] == role for t in turns) for role in ("model", "environment", "tool")}
    return ", ".join(f"{k} {role} turn{'s' * (k != 1)}" for role, k in n.items())


def _turns(turns: list[dict], width: int) -> list[str]:
    """An episode turn by turn: each turn's role, then its text; the model's turns marked `▶`, the environment's and
    the tools' not (a tool turn names its tools)."""
    labels = [" ".join([safe(t["role"]), *([", ".join(map(safe, t["tools"]))] if t.get("tools") else [])])
              for t in turns]
    pad = max(map(len, labels))
    lines = []
    for t, label in zip(turns, labels):
        head = f"    {'▶' if t['role'] == 'model' else ' '} {label:<{pad}}  "
        text = textwrap.fill(safe(t["text"]) or "(empty)", max(20, width - len(head)))
        lines.append(head + textwrap.indent(text, " " * len(head))[len(head):])
    return lines


def _value(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def main(args: argparse.Namespace) -> int:
    try:
        chosen = choose(load(args.run), args.step, args.best, args.worst)
    except (ValueError, json.JSONDecodeError) as e:
        print(f"streamrl samples: error: {e}", file=sys.stderr)
        return 2
    print(render(chosen[:max(1, args.limit)], args.width), end="")
    return 0
