"""The accounting a learner ends with, when it ends at the step of its newest checkpoint: `<run>/accounting.json`.

A checkpoint keeps the accounting of the moment it was saved. A run that ends at a step it has just checkpointed
(learner.checkpoint_every divides its steps) saves no other checkpoint, so what came after that save (the groups
drained at shutdown, the actors' final reports) was only in summary.json, and a resume of the finished run went on
from the checkpoint: its first life's sessions unreported again, its `lost_at_shutdown` gone. So such a learner
writes its final accounting here, naming the checkpoint, and a resume from that very checkpoint goes on from it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from streamrl.run import jsonfiles

log = logging.getLogger("streamrl.learner")

FILE = "accounting.json"


def write(run_path: Path, checkpoint: str, step: int, intake: dict) -> None:
    """The learner's final accounting (`Intake.state`), ending at `step`, the step of its newest `checkpoint`."""
    jsonfiles.write(run_path / FILE, {"checkpoint": checkpoint, "step": step, "intake": intake})


def resumed(run_path: Path, checkpoint: str, state: dict) -> dict | None:
    """The accounting a resume from `checkpoint` (its streamrl.json `state`) goes on from: the final one of the life
    that ended at it, else the checkpoint's own. The final one must continue the checkpoint's (the same step, the
    same groups used, no fewer received); anything else is set aside with a warning."""
    saved = state.get("intake")
    try:
        end = json.loads((run_path / FILE).read_text())
    except FileNotFoundError:
        return saved
    except (OSError, ValueError) as e:
        log.warning("learner: %s unreadable (%s); the accounting goes on from checkpoint %s", FILE, e, checkpoint)
        return saved
    if not isinstance(end, dict) or end.get("checkpoint") != checkpoint or end.get("step") != state.get("step"):
        return saved  # the end of another life (a checkpoint saved later, or one a killed learner never ended at)
    intake = end.get("intake")
    if saved is not None and not (isinstance(intake, dict) and intake.get("used") == saved["used"]
                                  and intake.get("receiver", {}).get("received", -1) >= saved["receiver"]["received"]):
        log.warning("learner: %s does not continue checkpoint %s's accounting; going on from the checkpoint's",
                    FILE, checkpoint)
        return saved
    log.info("learner: the accounting goes on from the end of the life that saved %s (%s: its final reports and "
             "the groups drained at its shutdown)", checkpoint, FILE)
    return intake
