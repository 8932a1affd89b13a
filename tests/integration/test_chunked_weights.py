"""Weights larger than one message: a ~40 MB model under a 4 MiB message cap trains to the end over
ZeroMQ, every version crossing as chunks (before chunking, no actor ever got its weights)."""

from __future__ import annotations

import pytest
from procs import metrics, summary

pytestmark = pytest.mark.slow

# 3 layers of hidden 512 / MLP 1536 in float32: ~10.3 M parameters, ~41 MB a version, 14 chunks under 4 MiB.
BIG = ["model.hidden_size=512", "model.num_layers=3", "model.num_heads=8", "model.intermediate_size=1536"]


def test_a_40_mb_model_under_a_4_mib_message_cap_trains_to_the_end_over_zeromq(run_job):
    run = run_job(*BIG, "transport.max_message_bytes=4194304", "steps=4", "actors.num=1", "learner.batch_groups=4",
                  "actors.weights_timeout_s=600",  # a loaded machine can take minutes to start the learner
                  name="chunked", timeout=600)
    assert [r["step"] for r in metrics(run)] == [0, 1, 2, 3]
    s = summary(run)
    assert s["learner_version"] == 4 and not s["stopped_early"]
    assert s["weight_requests_rejected"] == {}
    actor_log = (run / "logs" / "actor-0.log").read_text()
    applied = int(actor_log.split("'versions_applied': ")[1].split(",")[0])
    assert applied >= 2, "the actor must load new versions, each one crossing as 14 chunks"
