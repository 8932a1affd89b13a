"""Fixtures of the comm tests."""

from __future__ import annotations

import pytest
import zmq


@pytest.fixture
def zmq_ctx():
    """A context plus `track(obj)`: every tracked socket or channel is closed before the context terms."""
    ctx = zmq.Context()
    things = []

    def track(obj):
        things.append(obj)
        return obj

    yield ctx, track
    for obj in reversed(things):
        obj.close(linger=0) if isinstance(obj, zmq.Socket) else obj.close()
    ctx.term()

