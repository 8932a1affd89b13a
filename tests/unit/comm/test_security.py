"""CurveZMQ: listed actor keys get through on every channel; anyone else is refused and counted."""

from __future__ import annotations

import logging
import stat
import time

import pytest
import torch
import zmq
from zmq.auth import create_certificates

from streamrl.comm import codec, security
from streamrl.comm.control import ControlServer, Inbox
from streamrl.comm.groups import GroupReceiver, GroupSender
from streamrl.comm.weights.publisher import WeightPublisher
from streamrl.comm.weights.subscriber import WeightSubscriber

pytestmark = pytest.mark.timeout(60)
ANY = "tcp://127.0.0.1:*"


def group() -> codec.ScoredGroup:
    return codec.ScoredGroup.from_samples(prompt_id="p", policy_version=0, actor_id="actor-0", prompt_tokens=[1],
                                         completions=[[2], [3]], logprobs=[[-1.0], [-1.0]], rewards=[1.0, 0.0],
                                         finish_reasons=["stop", "stop"])


def received_within(receiver: GroupReceiver, seconds: float, until=lambda n: False) -> int:
    """Groups taken in `seconds`, or as soon as until(groups so far) holds."""
    deadline, n = time.monotonic() + seconds, 0
    while time.monotonic() < deadline and not until(n):
        n += receiver.take() is not None
        time.sleep(0.01)
    return n


@pytest.fixture
def secured(tmp_path):
    security.make_keys(tmp_path / "keys", actors=1)
    (tmp_path / "stranger").mkdir()
    create_certificates(tmp_path / "stranger", "actor-0")  # a well-formed key pair nobody authorized
    ctx = zmq.Context()
    gate = security.Gatekeeper(ctx, tmp_path / "keys")
    learner = security.learner_curve(tmp_path / "keys")
    receiver = GroupReceiver(ctx, ANY, 16, 1 << 20, None, learner)
    publisher = WeightPublisher(ctx, ANY, 1 << 20, learner)
    control = ControlServer(ctx, ANY, publisher, learner)
    yield tmp_path, ctx, gate, receiver, (publisher, control)
    receiver.close()
    control.close()
    publisher.close()
    gate.stop()
    ctx.term()


def _endpoint(sock) -> str:
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def test_keys_are_written_with_secret_files_private(tmp_path):
    made = security.make_keys(tmp_path, actors=2)
    names = sorted(p.name for p in made)
    assert names == ["actor-0.key", "actor-0.key_secret", "actor-1.key", "actor-1.key_secret", "learner.key",
                     "learner.key_secret"]
    assert sorted(p.name for p in (tmp_path / "authorized").iterdir()) == ["actor-0.key", "actor-1.key"]
    assert stat.S_IMODE((tmp_path / "learner.key_secret").stat().st_mode) == 0o600


def test_an_authorized_actor_sends_groups_and_an_unlisted_key_is_refused_and_counted(secured):
    tmp, ctx, gate, receiver, _ = secured
    good = GroupSender(ctx, _endpoint(receiver.sock), 4, "actor-0", security.actor_curve(tmp / "keys", "actor-0"))
    stranger_curve = security.Curve(*zmq.auth.load_certificate(tmp / "stranger" / "actor-0.key_secret"),
                                    server_public=security.learner_curve(tmp / "keys").public)
    stranger = GroupSender(ctx, _endpoint(receiver.sock), 4, "actor-0", stranger_curve)
    plain = ctx.socket(zmq.PUSH)  # no CURVE at all
    plain.connect(_endpoint(receiver.sock))
    assert good.send(group(), timeout_s=5)
    stranger.send(group(), timeout_s=0.5)
    if plain.poll(500, zmq.POLLOUT):  # a plain socket never completes the handshake, so this rarely sends
        plain.send_multipart(codec.encode_groups([group()]), zmq.NOBLOCK)
    # Both events made to happen (a loaded machine takes its time over CURVE handshakes), then a last look.
    n = received_within(receiver, 60.0, until=lambda n: n >= 1 and gate.refused >= 1)
    assert n + received_within(receiver, 0.5) == 1  # only the authorized actor's group
    assert gate.refused >= 1
    for s in (good, stranger):
        s.close()
    plain.close(0)


def test_weights_reach_an_authorized_subscriber_and_not_a_stranger(secured):
    tmp, ctx, gate, _, (publisher, control) = secured
    publisher.publish(4, {"w": torch.ones(3)})
    pub, router = _endpoint(publisher.pub), _endpoint(control.sock)

    def subscriber(curve: security.Curve) -> WeightSubscriber:
        return WeightSubscriber(ctx, pub, Inbox(ctx, router, "actor-0", 1 << 20, curve), 1 << 20, curve)

    friend = subscriber(security.actor_curve(tmp / "keys", "actor-0"))
    stranger = subscriber(security.Curve(*zmq.auth.load_certificate(tmp / "stranger" / "actor-0.key_secret"),
                                         server_public=security.learner_curve(tmp / "keys").public))
    deadline = time.monotonic() + 60
    got = {"friend": None, "stranger": None}
    asked = 0.0
    while time.monotonic() < deadline and (got["friend"] is None or gate.refused < 1):  # both, however slow
        if time.monotonic() - asked > 0.5:  # the answer is a broadcast: ask again until the subscription is live
            for s in (friend, stranger):
                s.request(have_version=-1)
            asked = time.monotonic()
        control.serve()
        for name, s in (("friend", friend), ("stranger", stranger)):
            got[name] = got[name] or s.poll(10)
    for _ in range(20):  # a last look: what reached the friend never reaches the stranger
        control.serve()
        got["stranger"] = got["stranger"] or stranger.poll(25)
    assert got["friend"] is not None and got["friend"][0] == 4
    assert got["stranger"] is None and gate.refused >= 1
    for s in (friend, stranger):
        s.close()
        s.inbox.close()


def test_missing_keys_fail_with_the_file_and_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"actor-3.*streamrl keys"):
        security.actor_curve(tmp_path, "actor-3")


@pytest.mark.parametrize("host, curve, warned", [("0.0.0.0", None, True), ("127.0.0.1", None, False),
                                                 ("localhost", None, False),
                                                 ("0.0.0.0", security.Curve(b"x" * 40, b"y" * 40), False)])
def test_binding_beyond_loopback_without_authentication_warns(caplog, host, curve, warned):
    with caplog.at_level(logging.WARNING, logger="streamrl.comm.security"):
        security.warn_if_exposed(host, curve)
    assert ("curve_keys is not set" in caplog.text) == warned
