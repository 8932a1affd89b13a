"""Loaded by every Python process of a test run whose PYTHONPATH starts with this folder (and
STREAMRL_TEST_HOLD_EVAL names a file that does not exist yet): the first actor to start evaluating a shard writes
its pid and the version into that file and then holds inside the evaluation until it is killed, so the test kills
it mid-eval by construction, not by luck. Every other evaluation (the other actor's, the re-issued shard) runs as
usual."""

import os
import time

MARKER = os.environ.get("STREAMRL_TEST_HOLD_EVAL")

if MARKER:
    from streamrl.actors import evals as _evals

    _evaluate = _evals.ActorEvals.evaluate

    def _held(self, req, stop):
        if self.weights.hold(req.version, stop):
            try:
                fd = os.open(MARKER, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:  # another evaluation was the one held
                return _evaluate(self, req, stop)
            os.write(fd, f"{os.getpid()} {req.version}".encode())
            os.close(fd)
            while True:  # mid-eval, holding version req.version, until the test kills this process
                time.sleep(0.05)
        return _evaluate(self, req, stop)

    _evals.ActorEvals.evaluate = _held
