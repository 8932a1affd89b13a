"""Loaded by every Python process of a test run whose PYTHONPATH starts with this folder: with
STREAMRL_TEST_SHORT_WAITS="<note_s>,<grace_s>", `streamrl run` says what it waits for after note_s without a step
(supervisor.WAIT_NOTE_S, 15 s) and kills a frozen learner grace_s after one Ctrl-C (supervisor.STOP_GRACE_S,
30 s). The same code paths, reached in seconds instead of the better part of a minute."""

import os

if spec := os.environ.get("STREAMRL_TEST_SHORT_WAITS"):
    from streamrl.commands import supervisor

    supervisor.WAIT_NOTE_S, supervisor.STOP_GRACE_S = (float(s) for s in spec.split(","))
