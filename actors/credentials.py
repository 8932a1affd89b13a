"""Per-episode credentials of the actor's endpoint: only the agent an actor started may speak for its episode.

An episode's credential is `<episode id>:<tag>`, the tag an HMAC-SHA256 of the id under a key the endpoint draws
when it starts (`secrets.token_bytes(32)`, held in memory only). Without the key a tag cannot be guessed; it is
checked in constant time (`hmac.compare_digest`); and checking needs no table of live episodes, so a genuine late
request of an episode that has ended is told apart from a forged one (404 vs 401). The client streamrl hands an
agent sends it as its api_key (`Authorization: Bearer ...`); a client whose key is set once for every episode
(verifiers' interception server) sends it in the body's `user` field.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets


class EpisodeKeys:
    """Issues and verifies the credentials of one endpoint's episodes."""

    def __init__(self):
        self._key = secrets.token_bytes(32)

    def issue(self, episode_id: str) -> str:
        return f"{episode_id}:{self._tag(episode_id)}"

    def verify(self, credential) -> str | None:
        """The episode `credential` speaks for; None for no credential, a malformed one or a forged one."""
        if not isinstance(credential, str):
            return None
        episode, sep, tag = credential.rpartition(":")
        if not sep or not episode:
            return None
        given = tag.encode("utf-8", "surrogatepass")
        return episode if hmac.compare_digest(given, self._tag(episode).encode()) else None

    def _tag(self, episode_id: str) -> str:
        mac = hmac.new(self._key, episode_id.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def named(credential) -> bool:
    """Whether a string is shaped like a credential (it names an episode, genuine or not)."""
    return isinstance(credential, str) and ":" in credential
