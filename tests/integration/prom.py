"""A real Prometheus server for tests (Debian's `prometheus` package; `.ci/run` installs it)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

MONITORING = Path(__file__).resolve().parents[2] / "monitoring"


def scrape_config(learner: str, actors: list[str], interval: str = "1s") -> dict:
    """monitoring/prometheus.yml with the test's targets and a fast scrape and rule interval."""
    cfg = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    cfg["global"].update(scrape_interval=interval, evaluation_interval=interval)
    cfg["rule_files"] = [str(MONITORING / f) for f in cfg["rule_files"]]
    jobs = {job["job_name"]: job for job in cfg["scrape_configs"]}
    jobs["streamrl-learner"]["static_configs"] = [{"targets": [learner]}]
    jobs["streamrl-actors"]["static_configs"] = [{"targets": actors}]
    return cfg


class Prometheus:
    def __init__(self, binary: str, config: dict, workdir: Path, port: int):
        self.url = f"http://127.0.0.1:{port}"
        workdir.mkdir(parents=True, exist_ok=True)
        cfg_path = workdir / "prometheus.yml"
        cfg_path.write_text(yaml.safe_dump(config))
        self.log = workdir / "prometheus.log"
        self.proc = subprocess.Popen(
            [binary, f"--config.file={cfg_path}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.url + "/-/ready", timeout=1)
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"prometheus did not start:\n{self.log.read_text()[-2000:]}") from None
                time.sleep(0.2)

    def api(self, path: str, **params) -> dict:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read())
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def value(self, expr: str, default: float | None = None) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else default

    def wait_for(self, expr: str, timeout: float = 60, what: str = "") -> list[dict]:
        """Poll until the instant query returns data."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.query(expr)
            if result:
                return result
            time.sleep(0.5)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what or expr}")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def signals(expr: str) -> list[str]:
    """The operands of an alert expression's comparisons and set operators (`a > 0.9 * b and c == 0`
    → [a, 0.9 * b, c]), number literals left out: the series an alert watches, with or without
    the alert firing. Splits only outside (), {}, [] and quotes; unwraps fully parenthesised parts."""
    expr = " ".join(expr.split())
    parts, depth, quote, start, i = [], 0, None, 0, 0
    while i < len(expr):
        c = expr[i]
        if quote:
            quote = None if c == quote else quote
        elif c in "\"'":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0:
            op = next((o for o in ("==", "!=", ">=", "<=", ">", "<") if expr.startswith(o, i)), None)
            word = next((w for w in (" and ", " or ", " unless ") if expr.startswith(w, i)), None)
            if op or word:
                parts.append(expr[start:i])
                i += len(op or word)
                start = i
                continue
        i += 1
    parts.append(expr[start:])
    out = []
    for part in (p.strip() for p in parts):
        if _wrapped(part):
            out += signals(part[1:-1])
        elif part and not _is_number(part):
            out.append(part)
    return out


def _wrapped(s: str) -> bool:
    if not (s.startswith("(") and s.endswith(")")):
        return False
    depth = 0
    for i, c in enumerate(s):
        depth += c == "("
        depth -= c == ")"
        if depth == 0 and i < len(s) - 1:
            return False
    return True


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False
