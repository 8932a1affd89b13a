"""The loop of learner ranks > 0: take rank 0's batch share, train, and join every collective
rank 0 enters (gathering weights under ZeRO-3, checkpoints) at the same steps, until told to stop.
Which steps those are comes from `learner.schedule`, the one place rank 0 asks too."""

from __future__ import annotations

import logging

from streamrl.config import Config
from streamrl.learner import schedule
from streamrl.learner.engine import Engine
from streamrl.learner.ranks import STEP, STOP_AND_SAVE, Ranks

log = logging.getLogger("streamrl.learner")


def run(cfg: Config, engine: Engine, ranks: Ranks, checkpoints_dir: str, step: int, learner_version: int) -> dict:
    gathers = cfg.learner.zero_stage == 3  # below ZeRO-3 rank 0 reads full weights alone
    if gathers:
        engine.published_state()                       # rank 0's first publish
    while (cmd := ranks.receive(engine)).kind == STEP:  # broadcast → train on our share → gather outputs
        due = schedule.due(step, learner_version, cfg)
        if gathers and due.publish:
            engine.published_state()
        if gathers and due.weight_stats:
            engine.weight_stats()
        learner_version, step = learner_version + 1, step + 1
        if due.checkpoint:
            _save(engine, checkpoints_dir, step, gathers)
    if cmd.kind == STOP_AND_SAVE:
        _save(engine, checkpoints_dir, step, gathers)
    engine.close()
    log.info("learner rank %d done at step %d", ranks.rank, step)
    return {"rank": ranks.rank, "steps": step}


def _save(engine: Engine, checkpoints_dir: str, step: int, gathers: bool) -> None:
    if gathers:
        engine.full_state_dict()  # rank 0 writes policy.safetensors from the gathered weights first
    engine.save(checkpoints_dir, f"step-{step}")
