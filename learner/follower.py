"""The loop of learner ranks > 0: take rank 0's batch share, train, and join every collective
rank 0 enters (gathering weights under ZeRO-3, checkpoints) at the same steps, until told to stop."""

from __future__ import annotations

import logging

from learner.engine import Engine
from learner.ranks import STEP, STOP_AND_SAVE, Ranks
from streamrl.config import Config

log = logging.getLogger("streamrl.learner")


def run(cfg: Config, engine: Engine, ranks: Ranks, checkpoints_dir: str, step: int, version: int) -> dict:
    L, gathers = cfg.learner, cfg.learner.zero_stage == 3  # below ZeRO-3 rank 0 reads full weights alone
    if gathers:
        engine.full_state_dict()                       # rank 0's first publish
    while (cmd := ranks.receive(engine)).kind == STEP:  # broadcast → train on our share → gather outputs
        if gathers and (version + 1) % L.publish_every == 0:
            engine.full_state_dict()
        if gathers and L.weight_stats_every and (step + 1) % L.weight_stats_every == 0:
            engine.weight_stats()
        if gathers and cfg.eval.every and (step + 1) % cfg.eval.every == 0:
            engine.full_state_dict()                   # rank 0 evaluates the whole policy
        version, step = version + 1, step + 1
        if L.checkpoint_every and step % L.checkpoint_every == 0:
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
