"""CurveZMQ encryption and authentication for every streamrl socket (`transport.curve_keys`).

`streamrl keys DIR --actors N` writes ZeroMQ certificates: the learner's key pair, one pair per
actor, and `DIR/authorized/` with the actors' public keys. The learner (every socket a CURVE
server) admits only clients whose public key is in `authorized/`; a peer without a listed key
cannot connect, send a group or receive weights. On a cluster, give the learner node `learner.*`
and `authorized/`, and each actor node `learner.key` (public) and its own `actor-<i>.key_secret`.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import socket
import threading
from pathlib import Path

import zmq

log = logging.getLogger("streamrl.comm.security")


@dataclasses.dataclass(frozen=True)
class Curve:
    """Keys one process uses on its sockets; server_public is None on the learner (the server)."""

    public: bytes
    secret: bytes
    server_public: bytes | None = None

    def apply(self, sock: zmq.Socket) -> None:
        """Before bind/connect."""
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret
        if self.server_public is None:
            sock.curve_server = True
        else:
            sock.curve_serverkey = self.server_public


def make_keys(directory: str | Path, actors: int, force: bool = False) -> list[Path]:
    """Certificates for the learner and `actors` actors, and authorized/ with the actors' public keys.

    Keys already in `directory` are kept unless `force`: then every old key file and every old
    authorized actor key is removed first, so no actor holding an old key is still admitted.
    """
    from zmq.auth import create_certificates

    if actors < 0:
        raise ValueError(f"--actors {actors}: must be 0 or more (one key pair per actor)")
    d = Path(directory)
    if d.exists() and not d.is_dir():
        raise ValueError(f"{d}: is a file; give a folder for the keys")
    old = sorted([*d.glob("*.key"), *d.glob("*.key_secret"), *d.glob("authorized/*.key")]) if d.is_dir() else []
    if old and not force:
        names = ", ".join(str(p.relative_to(d)) for p in old[:4]) + (", ..." if len(old) > 4 else "")
        raise ValueError(f"{d} already holds keys ({names}); pass --force to replace them all (the old keys stop "
                         "working: every actor needs its new key), or give another folder")
    for p in old:
        p.unlink()
    (d / "authorized").mkdir(parents=True, exist_ok=True)
    made = []
    for name in ["learner", *(f"actor-{i}" for i in range(actors))]:
        public, secret = create_certificates(d, name)
        Path(secret).chmod(0o600)
        made += [Path(public), Path(secret)]
        if name != "learner":
            (d / "authorized" / f"{name}.key").write_bytes(Path(public).read_bytes())
    return made


def _load(path: Path, what: str) -> tuple[bytes, bytes | None]:
    from zmq.auth import load_certificate

    if not path.is_file():
        raise FileNotFoundError(f"transport.curve_keys: {what} {path} is missing (make keys with `streamrl keys`)")
    return load_certificate(path)


def learner_curve(directory: str | Path) -> Curve:
    public, secret = _load(Path(directory) / "learner.key_secret", "the learner's secret key")
    return Curve(public, secret)


def actor_curve(directory: str | Path, actor_id: str) -> Curve:
    d = Path(directory)
    public, secret = _load(d / f"{actor_id}.key_secret", f"{actor_id}'s secret key")
    server_public, _ = _load(d / "learner.key", "the learner's public key")
    return Curve(public, secret, server_public)


class Gatekeeper:
    """The learner's ZAP handler: admits listed actor keys, refuses and counts the rest."""

    def __init__(self, ctx: zmq.Context, directory: str | Path):
        from zmq.auth import load_certificates
        from zmq.auth.thread import ThreadAuthenticator

        self.authorized_dir = Path(directory) / "authorized"
        if not self.authorized_dir.is_dir():
            raise FileNotFoundError(f"transport.curve_keys: {self.authorized_dir} is missing "
                                    "(make keys with `streamrl keys`)")
        self.allowed = set(load_certificates(self.authorized_dir))
        if not self.allowed:
            log.warning("transport.curve_keys: %s lists no actor key; every actor will be refused",
                        self.authorized_dir)
        self.refused = 0
        self._lock = threading.Lock()
        self.auth = ThreadAuthenticator(ctx)
        self.auth.start()
        self.auth.configure_curve_callback(domain="*", credentials_provider=self)

    def callback(self, domain: str, client_key: bytes) -> bool:
        if client_key in self.allowed:
            return True
        with self._lock:
            if not self.refused:
                log.warning("refused a peer whose CURVE key %s is not in %s; further refusals are only counted",
                            client_key.decode(errors="replace"), self.authorized_dir)
            self.refused += 1
        return False

    def stop(self) -> None:
        self.auth.stop()


def warn_if_exposed(host: str, curve: Curve | None) -> None:
    """Binding beyond loopback without authentication lets anyone who can reach the port in."""
    if curve is not None:
        return
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        addresses = {host}
    if all(_is_ip(a) and ipaddress.ip_address(a).is_loopback for a in addresses):
        return
    log.warning("transport.host=%s is reachable from other machines and transport.curve_keys is not set: "
                "anyone who can reach these ports can send groups and read weights. Make keys with "
                "`streamrl keys DIR --actors N` and set transport.curve_keys=DIR on learner and actors.", host)


def _is_ip(a: str) -> bool:
    try:
        ipaddress.ip_address(a)
        return True
    except ValueError:
        return False
