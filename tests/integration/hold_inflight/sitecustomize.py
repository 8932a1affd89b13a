"""Loaded by every Python process of a test run whose PYTHONPATH starts with this folder (and
STREAMRL_TEST_HOLD_INFLIGHT=1): actor 0 holds one generation right after its first decoding step until the
learner's next version has landed (at most HOLD_S), so an in-flight update happens mid-generation by
construction, not by luck. The other actor keeps the learner fed meanwhile (the learner asks it for more
groups once actor 0 falls silent)."""

import os
import time

HOLD_S = 60.0

if os.environ.get("STREAMRL_TEST_HOLD_INFLIGHT") == "1":
    from streamrl.actors import weights as _weights
    from streamrl.models import sampling as _sampling

    _holder: list = []  # actor 0's ActorWeights, once made
    _init = _weights.ActorWeights.__init__
    _generate = _sampling.generate

    def _remember(self, *args, **kwargs):
        _init(self, *args, **kwargs)
        if self.actor_id == "actor-0":
            _holder.append(self)

    def _held_generate(model, prompts, n, *, between_steps=None, **kwargs):
        w = _holder[0] if _holder else None
        if between_steps is None or w is None or w.inflight_loads or w.version < 1:
            return _generate(model, prompts, n, between_steps=between_steps, **kwargs)
        calls = [0]

        def step() -> int:
            calls[0] += 1
            version = between_steps()
            if calls[0] == 2:  # after the first decoding step: wait for the event, a newer version loaded
                start, deadline = version, time.monotonic() + HOLD_S
                while version == start and time.monotonic() < deadline:
                    time.sleep(0.01)
                    version = between_steps()
            return version

        return _generate(model, prompts, n, between_steps=step, **kwargs)

    _weights.ActorWeights.__init__ = _remember
    _sampling.generate = _held_generate
