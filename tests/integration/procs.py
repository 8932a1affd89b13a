"""Start real streamrl processes on loopback and read what they leave in the run directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FREE_PORTS = ["transport.group_port=0", "transport.weights_port=0", "transport.weights_request_port=0"]


def streamrl(*args: str, cwd: Path, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    """Run the `streamrl` command as a user would, in its own process."""
    proc = subprocess.run([sys.executable, "-m", "streamrl", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if check and proc.returncode != 0:
        raise AssertionError(f"streamrl {' '.join(args)} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}\n"
                             f"{_logs(cwd)}")
    return proc


def _logs(cwd: Path) -> str:
    out = []
    for log in sorted(cwd.glob("runs/*/logs/*.log")):
        tail = log.read_text(errors="replace").splitlines()[-25:]
        out.append(f"--- {log.relative_to(cwd)} (tail)\n" + "\n".join(tail))
    return "\n".join(out)


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


