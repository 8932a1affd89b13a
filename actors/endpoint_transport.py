"""The client streamrl hands an agent calls the actor's endpoint in process: the same ASGI app, no socket.

An agent's `openai.OpenAI` sends through httpx (httpx2 from openai 3 on); its transport here hands each request to
the endpoint's ASGI app (`streamrl.actors.endpoint`, its routes, body limits, in-flight bounds and per-episode
credential checks: nothing is skipped) on the endpoint's own event loop, and waits for the answer. What it saves is
what loopback HTTP costs an episode's every turn: a connection pool, h11 on both sides, the socket's round trip and
the server's accept and parse, each holding the GIL the actor's generation needs.

The client keeps the endpoint's URL as its base_url, so an agent that makes its own client from it
(`openai.OpenAI(base_url=str(client.base_url), ...)`) reaches the same endpoint over loopback HTTP; only the
transport differs. The guards against half-sent HTTP requests (`streamrl.actors.endpoint_protocol`) concern
sockets and stay with the server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import importlib
import logging

log = logging.getLogger("streamrl.actor")

CLIENT = ("in-process", 0)
"""The ASGI scope's client: the request came from an agent this actor started, not from a socket."""


def httpx_of(openai):
    """The httpx module the installed `openai` sends through (httpx, or httpx2 from openai 3 on)."""
    client = next(c for c in openai.DefaultHttpxClient.__mro__ if c.__name__ == "Client")
    return importlib.import_module(client.__module__.partition(".")[0])


def http_client(openai, app, loop: asyncio.AbstractEventLoop, timeout_s: float):
    """An `openai.DefaultHttpxClient` whose transport calls `app` on `loop` (the endpoint's) in process."""
    httpx = httpx_of(openai)

    class InProcess(httpx.BaseTransport):
        """A sync transport: runs on the agent's thread, the app on the endpoint's loop."""

        def handle_request(self, request):
            body = request.read()
            scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": request.method,
                     "headers": [(k.lower(), v) for k, v in request.headers.raw], "scheme": request.url.scheme,
                     "path": request.url.path, "raw_path": request.url.raw_path.split(b"?")[0],
                     "query_string": request.url.query, "server": (request.url.host, request.url.port),
                     "client": CLIENT, "root_path": ""}
            wait = (request.extensions.get("timeout") or {}).get("read") or timeout_s
            try:
                answer = asyncio.run_coroutine_threadsafe(call(app, scope, body), loop)
            except RuntimeError as e:  # the loop has stopped: as a refused connection would be
                raise httpx.ConnectError(f"the actor's endpoint is closed ({e})", request=request) from None
            try:
                status, headers, content = answer.result(wait)
            except cf.TimeoutError:
                answer.cancel()
                raise httpx.ReadTimeout(f"no answer from the actor's endpoint within {wait:g}s",
                                        request=request) from None
            except cf.CancelledError:  # the server stopped with the request in it
                raise httpx.RemoteProtocolError("the actor's endpoint stopped before answering",
                                                request=request) from None
            return httpx.Response(status, headers=headers, content=content, request=request)

    return openai.DefaultHttpxClient(transport=InProcess(), timeout=timeout_s)


def async_http_client(openai, app):
    """An `openai.DefaultAsyncHttpxClient` on httpx's own ASGITransport over `app`: for an agent that is a coroutine,
    run on the endpoint's loop itself, so its calls go straight into the app (no thread, no hop between loops)."""
    return openai.DefaultAsyncHttpxClient(transport=httpx_of(openai).ASGITransport(app=app, client=CLIENT))


async def call(app, scope: dict, body: bytes) -> tuple[int, list, bytes]:
    """One request through the ASGI app: (status, headers, body). An exception in the app is a 500, logged, as the
    server answers one."""
    head: dict = {}
    chunks: list[bytes] = []
    done = asyncio.Event()
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()  # the app reads nothing more: it is told the client left only after the answer
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            head.update(status=message["status"], headers=message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                done.set()

    try:
        await app(scope, receive, send)
    except Exception:
        log.exception("the actor's endpoint failed on an in-process request")
        if "status" not in head:
            return 500, [(b"content-type", b"application/json")], (
                b'{"error": {"message": "internal error of the endpoint", "type": "server_error", "code": "internal"}}')
    finally:
        done.set()
    return head["status"], head["headers"], b"".join(chunks)
