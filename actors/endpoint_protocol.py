"""The connection-level guards of the actor's endpoint (`streamrl.actors.endpoint`): uvicorn's h11 protocol, plus
what a server that trusts no client needs and uvicorn does not do by itself.

- A request's headers must arrive within `endpoint.read_timeout_s` of the connection (or, on a kept-alive one, of
  their first byte): a client that sent part of them gets 408, one that sent nothing is closed. uvicorn arms no
  timer before a connection's first answer, so a half-sent request would otherwise hold its connection forever.
- A client still sending a body the endpoint has already answered (413: too large) is cut off after the same time
  (the bytes are read and dropped until then, so the answer reaches it instead of a reset).
- A request h11 cannot read (a `Content-Length` that is no number, -1; headers over 16 KiB; no HTTP at all) gets
  OpenAI's error shape instead of uvicorn's plain text, and is counted instead of logged line by line.

The body's own deadline and size limit are the app's (the endpoint reads it); these cover what happens before the
app is called and after it answered.
"""

from __future__ import annotations

import http
import json
import logging
import socket

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

# uvicorn logs a warning per malformed request (counted instead); an error in the app still logs its traceback.
_LOG = logging.getLogger("streamrl.actor.endpoint")
_LOG.setLevel(logging.ERROR)


def raw_response(status: int, payload: dict) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, written outside h11 (whose state may be an error)."""
    body = json.dumps(payload).encode()
    head = (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


class GuardedH11(H11Protocol):
    """Set `endpoint` on a subclass: it gives `read_timeout_s`, `count(code)` and `error(message, code)`."""

    endpoint = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.logger = _LOG
        self._deadline = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        # asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP, not on those accepted from a socket
        # made with proto 0: an answer's headers and body are two writes, and Nagle's algorithm would hold the body
        # for the client's delayed ACK (~40 ms a request).
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        self.endpoint.count("bad_http")
        self.transport.write(raw_response(400, self.endpoint.error(
            "not a valid HTTP/1.1 request: its request line, headers (at most 16 KiB) or Content-Length (a number of "
            "bytes) could not be read", "bad_http")))
        self.transport.close()

    def _in_app(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _watch(self) -> None:
        """The deadline runs while the client owes bytes the app is not waiting for: a request's headers, or the
        rest of a body already answered. An idle kept-alive connection is uvicorn's (timeout_keep_alive)."""
        state = self.conn.their_state
        owes = state is h11.SEND_BODY or (state is h11.IDLE and bool(self.conn.trailing_data[0]))
        if self.transport.is_closing() or self._in_app() or not owes:
            self._disarm()
        elif self._deadline is None:
            self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.endpoint.read_timeout_s, self._late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _late(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self._in_app():
            return
        if self.conn.their_state is h11.IDLE:  # a request's headers are late (not the rest of an answered body)
            self.endpoint.count("read_timeout")
        if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:  # part of them came: say why
            self.transport.write(raw_response(408, self.endpoint.error(
                f"the request's headers did not arrive within endpoint.read_timeout_s="
                f"{self.endpoint.read_timeout_s:g}s", "read_timeout")))
        self.transport.close()
