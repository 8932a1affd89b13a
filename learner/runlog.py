"""The run directory: runs/<name>/{config.yaml, metrics.jsonl, summary.json, checkpoints/}.

A full disk never loses what is there: a metrics line that cannot be written whole is cut back
(metrics.jsonl stays one valid record per line) and raises `DiskFull` naming the file, and
summary.json has its space reserved from the start (a "running" placeholder, padded), so the
final summary (marked failed, with the reason) is written over it in place when nothing else fits.
"""

from __future__ import annotations

import json
import logging
import os
import time

from streamrl import config as config_lib
from streamrl.algo import mgrpo
from streamrl.learner.step import Step
from streamrl.run import fingerprint, jsonfiles, storage
from streamrl.telemetry.trackers import Trackers

log = logging.getLogger("streamrl.learner")
SUMMARY_RESERVE_BYTES = 64 * 1024  # summary.json's reserved space: far more than a summary takes


class RunLog:
    """trackers: the experiment trackers (monitoring.report_to) that get every record metrics.jsonl gets, and the
    summary; RunLog closes them."""

    def __init__(self, cfg: config_lib.Config, trackers: Trackers | None = None):
        self.dir = cfg.run_path
        self.dir.mkdir(parents=True, exist_ok=True)
        self.checkpoints = self.dir / "checkpoints"
        self._write(self.dir / "config.yaml", config_lib.dump(cfg))
        fingerprint.record(cfg)  # once, at the run's first start: what a resume must keep
        self._write(self.dir / "summary.json", json.dumps({"status": "running"}).ljust(SUMMARY_RESERVE_BYTES) + "\n")
        self.rewards: list[float] = []
        self.mgrpo = cfg.mgrpo.enabled
        self.layer2: list[tuple[int, int, float]] = []  # multi-layer GRPO: (step, layer2_groups, acc_t2) per step
        self.step_s = self.metrics_s = 0.0  # this process's steps: the base of the metrics overhead
        self._metrics = None
        self._metrics_size = 0
        self.trackers = trackers

    def _write(self, path, text: str) -> None:
        try:
            path.write_text(text)
        except OSError as e:
            raise (storage.DiskFull(path) if storage.is_disk_full(e, path) else e) from e

    def open(self, resumed_step: int) -> None:
        """Start metrics.jsonl afresh, or keep the records of the steps a resumed checkpoint holds. Steps logged
        after that checkpoint are about to be redone: the whole earlier file is first moved aside
        (`metrics.jsonl.before-resume-<step>-<time>`), never cut, so no record is destroyed."""
        path = self.dir / "metrics.jsonl"
        lines = [line for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        kept = [line for line in lines if json.loads(line)["step"] < resumed_step]
        if len(kept) < len(lines):
            aside = path.with_name(f"{path.name}.before-resume-{resumed_step}-{time.strftime('%Y%m%d-%H%M%S')}")
            os.replace(path, aside)
            log.warning("metrics.jsonl: steps %d and later are redone from the checkpoint; the earlier file is kept "
                        "as %s", resumed_step, aside.name)
        self._write(path, "".join(line + "\n" for line in kept))
        self.rewards = [json.loads(line)["reward_mean"] for line in kept]
        for line in kept:
            self._layer2(json.loads(line))
        self._metrics = open(path, "ab", buffering=0)
        self._metrics_size = path.stat().st_size

    def step(self, record: Step | dict, extra: dict | None = None) -> None:
        """Append one step's line: record (a Step, or the line's dict), then extra's keys (what the loop adds: the
        evaluation that came back, the intake's accounting, elapsed_s)."""
        record = record.record(extra) if isinstance(record, Step) else {**record, **(extra or {})}
        data = jsonfiles.line(record).encode()
        try:
            view = memoryview(data)
            while view:  # a nearly full disk takes part of a write, then refuses the rest
                view = view[os.write(self._metrics.fileno(), view):]
        except OSError as e:  # a line cut short would leave metrics.jsonl unreadable: cut it back
            os.ftruncate(self._metrics.fileno(), self._metrics_size)
            path = self.dir / "metrics.jsonl"
            raise (storage.DiskFull(path, "metrics", f"step {record['step']}'s record is not in it") if storage.is_disk_full(e, path) else e) from e
        self._metrics_size += len(data)
        if self.trackers:  # after the line is safe on disk: a tracker never holds a step metrics.jsonl lacks
            self.trackers.log(record)
        self.rewards.append(record["reward_mean"])
        self._layer2(record)
        self.step_s += record["step_s"]
        self.metrics_s += record.get("metrics_s", 0.0)

    def _layer2(self, record: dict) -> None:
        if self.mgrpo:
            self.layer2.append((record["step"], record.get("layer2_groups", 0), record.get("acc_t2") or 0.0))

    def summary(self, extra: dict, reward_range: tuple[float, float]) -> dict:
        # a step with no scored sample has no reward (None): the means are over the steps that have one
        rewards = [r for r in self.rewards if r is not None]
        n = len(rewards)
        k = max(1, n // 10)
        first = sum(rewards[:k]) / k if n else None
        last = sum(rewards[-k:]) / k if n else None
        span = reward_range[1] - reward_range[0]
        out = {
            "steps": len(self.rewards),
            "reward_first_10pct": first,
            "reward_last_10pct": last,
            "reward_range": list(reward_range),
            "improvement_fraction_of_range": (last - first) / span if n else None,
            # multi-layer GRPO: how many steps trained layer-2 groups once a correction had verified
            **({"mgrpo_layer2": mgrpo.layer2_coverage(self.layer2)} if self.layer2 else {}),
            **extra,
            **(self.trackers.report() if self.trackers else {}),
        }
        path = self.dir / "summary.json"
        try:
            jsonfiles.write(path, out)
        except OSError as e:
            if not storage.is_disk_full(e, path):
                raise
            (path.with_name(path.name + ".tmp")).unlink(missing_ok=True)
            text = json.dumps(jsonfiles.finite(out), indent=2) + "\n"
            with open(path, "r+b") as f:  # over the reserved placeholder: its blocks are already allocated
                f.write(text.encode())
                f.truncate()
        if self.trackers:
            self.trackers.close(out)
        return out

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
        if self.trackers:  # a run whose summary never got written still ends its trackers' runs (as failed)
            self.trackers.close(None)
