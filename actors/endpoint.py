"""The actor's OpenAI-compatible endpoint: `/v1/chat/completions`, `/v1/completions` and `/v1/models` on uvicorn
(its h11 protocol with the guards of `streamrl.actors.endpoint_protocol`) and Starlette's routing, on an event
loop in a thread of its own, bound to `endpoint.host` (loopback by default).

The event loop never touches the engine. Each request's body is read (at most MAX_BODY_BYTES whatever its
Content-Length or chunks say: 413; within `endpoint.read_timeout_s`: 408), parsed and checked (400), and its
credential verified (401: `streamrl.actors.credentials`; a request naming no episode at all is a 400), then it is
queued (`take`) for the actor's episode runner (`streamrl.actors.agents`), which batches the requests of
concurrent episodes into one generate call on the actor's own thread and answers each (`Request.answer`); the
loop waits for that answer (at most `endpoint.request_timeout_s`, then 503). At most MAX_IN_FLIGHT requests are
in the app at once, their bodies at most BODY_BUDGET bytes together (503 past either). `stream: true` gets the
answer as server-sent events and `n` (at most MAX_N) that many choices (`streamrl.actors.replies`).

The client streamrl hands each agent calls the same app in process, on the same loop
(`streamrl.actors.endpoint_transport`: every check above, no socket); the server is for clients an agent makes
itself.

Errors use OpenAI's shape: {"error": {"message", "type", "code"}}. Every answer the endpoint refuses itself is
counted by its code (`take_refused`: the actor's `endpoint_refused/<code>` counts) and logged once per code.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import socket
import threading
import time
from collections import Counter

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import Response
from starlette.routing import Route

from streamrl.actors import replies
from streamrl.actors.credentials import EpisodeKeys, named
from streamrl.actors.endpoint_protocol import GuardedH11

log = logging.getLogger("streamrl.actor")

ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
MAX_BODY_BYTES = 16 << 20
MAX_N = 16
MAX_IN_FLIGHT = 1024
"""Requests in the app at once: every episode's agent may call at once (task.agent_workers of them)."""
BODY_BUDGET = 256 << 20
"""Bytes of request bodies being read at once, all requests together."""
KEEP_ALIVE_S = 15
"""An idle kept-alive connection is closed after this: longer than httpx's 5 s, so the client closes it first."""


class BadRequest(ValueError):
    """A request the endpoint refuses: its message says what is wrong and what is allowed."""


class Refused(Exception):
    """An answer the endpoint gives itself (status, message, code), counted by code."""

    def __init__(self, status: int, message: str, code: str):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class Request:
    """One queued model call: kind ('chat' | 'completion'), the JSON body, the (verified) episode it belongs to.
    `on_answer` is called, from the runner's thread, once it is answered."""

    def __init__(self, kind: str, body: dict, episode_id: str, on_answer=lambda: None):
        self.kind, self.body, self.episode_id = kind, body, episode_id
        self.status, self.payload = 0, None
        self._on_answer = on_answer

    def answer(self, status: int, payload: dict) -> None:
        self.status, self.payload = status, payload
        self._on_answer()

    def fail(self, status: int, message: str, code: str) -> None:
        self.answer(status, error(message, code))


def error(message: str, code: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code}}


def check(kind: str, body) -> None:
    """Raises BadRequest for what the endpoint does not serve (the runner checks the rest against its episode)."""
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(body).__name__}")
    if not isinstance(body.get("model", ""), str):
        raise BadRequest("model: a string ('policy')")
    n = body.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N):
        raise BadRequest(f"n={n!r}: an integer from 1 to {MAX_N}")
    tools = body.get("tools")
    if tools is not None and (kind != "chat" or not isinstance(tools, list) or not all(
            isinstance(t, dict) and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str)
            for t in tools)):
        raise BadRequest("tools: on /v1/chat/completions, a list of {'type': 'function', 'function': {'name': ..., "
                         "'parameters': {...}}}")
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and _content_ok(m.get("content"))
                for m in messages):
            raise BadRequest("messages: a non-empty list of {'role': ..., 'content': ...} (content: a string, null, "
                             "or a list of {'type': 'text', 'text': ...} parts)")
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = body["prompt"] = prompt[0]  # a batch of one
        if not (isinstance(prompt, str) and prompt) and not (
                isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            raise BadRequest("prompt: a non-empty string or a list of token ids (one prompt per request)")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise BadRequest(f"max_tokens={max_tokens!r}: a positive integer")


def _content_ok(content) -> bool:
    return content is None or isinstance(content, str) or isinstance(content, list) and all(
        isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in content)


def parse(kind: str, raw: bytes, path: str) -> dict:
    """The checked JSON body of a request; BadRequest naming the route and what is wrong."""
    try:
        body = json.loads(raw)
    except RecursionError:  # the decoder's own limit: deep nesting is no request we serve
        raise BadRequest(f"{path}: the JSON is nested too deeply") from None
    except ValueError as e:
        raise BadRequest(f"{path}: not JSON: {e}") from None
    try:
        check(kind, body)
    except BadRequest as e:
        raise BadRequest(f"{path}: {e}") from None
    return body


def _json(status: int, payload: dict) -> Response:
    return Response(json.dumps(payload).encode(), status, media_type="application/json")


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class Endpoint:
    """The server, on its own daemon thread; `take` hands the actor's runner the next request (None on a wake),
    `keys` issues each episode's credential."""

    def __init__(self, host: str, port: int, request_timeout_s: float, actor_id: str, read_timeout_s: float = 10.0):
        self.requests: queue.Queue[Request | None] = queue.Queue()
        self.timeout_s, self.read_timeout_s, self.actor_id = request_timeout_s, read_timeout_s, actor_id
        self.keys = EpisodeKeys()
        self.refused_total: Counter = Counter()
        """Every answer the endpoint refused itself, by code (take_refused: those since the last take)."""
        self._refused: Counter = Counter()
        self._lock = threading.Lock()
        self._closing = False
        self._in_flight = self._buffered = 0  # the event loop's own: no lock
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=2048)
        protocol = type("EndpointH11", (GuardedH11,), {"endpoint": self})
        self.app = self._app()
        config = uvicorn.Config(self.app, http=protocol, loop="asyncio", lifespan="off", interface="asgi3",
                                log_config=None, access_log=False, proxy_headers=False, server_header=False,
                                timeout_keep_alive=KEEP_ALIVE_S, timeout_graceful_shutdown=int(read_timeout_s) + 1)
        logging.getLogger("uvicorn.error").setLevel(max(logging.WARNING, logging.getLogger("uvicorn.error").level))
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True,
                                       name=f"{actor_id}-endpoint")
        self.thread.start()
        while not self.server.started:  # serving before an agent's first call
            if not self.thread.is_alive():
                raise RuntimeError(f"{actor_id}: the endpoint's server stopped while starting (its log says why)")
            time.sleep(0.005)
        self.loop = self.server.servers[0].get_loop()  # the in-process transport's (streamrl.actors.endpoint_transport)
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{sock.getsockname()[1]}/v1"
        log.info("%s: OpenAI-compatible endpoint at %s", actor_id, self.url)

    def take(self, timeout_s: float) -> Request | None:
        try:
            return self.requests.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def wake(self) -> None:
        """Ends a `take` early (an agent returned: the runner has something to settle)."""
        self.requests.put(None)

    def take_refused(self) -> dict[str, int]:
        """What the endpoint refused since the last take, by code."""
        with self._lock:
            out, self._refused = dict(self._refused), Counter()
        return out

    def count(self, code: str) -> None:
        with self._lock:
            first = code not in self.refused_total
            self._refused[code] += 1
            self.refused_total[code] += 1
        if first:
            log.warning("%s: the endpoint refused a request (%s); every one is counted (endpoint_refused/%s), this "
                        "is logged once", self.actor_id, code, code)

    def error(self, message: str, code: str) -> dict:
        return error(message, code)

    def close(self) -> None:
        with self._lock:  # no request is queued after this
            self._closing = True
        while True:
            try:
                r = self.requests.get_nowait()
            except queue.Empty:
                break
            if r is not None:  # nobody will serve these any more
                r.fail(503, f"{self.actor_id}: the actor is stopping", "stopping")
        self.server.should_exit = True
        self.thread.join(self.read_timeout_s + 5)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(5)

    def _app(self) -> Starlette:
        routes = [Route(p, self._models, methods=["GET"]) for p in ("/v1/models", "/v1/models/")]
        routes += [Route(p + end, self._post, methods=["POST"]) for p in ROUTES for end in ("", "/")]
        app = Starlette(routes=routes, exception_handlers={404: self._no_route, 405: self._no_route})
        app.router.redirect_slashes = False
        return app

    async def _models(self, request: HttpRequest) -> Response:
        return _json(200, {"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": self.actor_id}]})

    async def _no_route(self, request: HttpRequest, exc) -> Response:
        self.count("not_found")
        return _json(404, error(f"no route {request.method} {_short(request.url.path)}; GET /v1/models, POST "
                                f"{' or '.join(ROUTES)}", "not_found"))

    async def _post(self, request: HttpRequest) -> Response:
        path = request.url.path
        try:
            if self._in_flight >= MAX_IN_FLIGHT:
                raise Refused(503, f"{MAX_IN_FLIGHT} requests in flight; retry later", "busy")
            self._in_flight += 1
            try:
                body = parse(ROUTES[path.rstrip("/")], await self._read(request), path)
                return await self._serve(ROUTES[path.rstrip("/")], body, self._episode(request, body))
            finally:
                self._in_flight -= 1
        except BadRequest as e:
            return self._refuse(Refused(400, str(e), "bad_request"))
        except Refused as e:
            return self._refuse(e)
        except _Gone:  # the client left: no one reads an answer
            return Response(status_code=400)

    def _refuse(self, e: Refused) -> Response:
        self.count(e.code)
        response = _json(e.status, error(e.message, e.code))
        if e.status == 408:  # a client too slow to send its body: no next request on this connection
            response.headers["connection"] = "close"
        return response

    async def _read(self, request: HttpRequest) -> bytes:
        """The body, whatever Content-Length or chunks claim: MAX_BODY_BYTES at most, within read_timeout_s."""
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:  # h11 has refused any other Content-Length (400)
            raise Refused(413, f"body of {length} bytes; at most {MAX_BODY_BYTES}", "too_large")
        # One deadline for the whole body (a client trickling a byte at a time cannot stretch it), cancelling this
        # task when it passes; not asyncio.wait_for, which wraps each receive in a task of its own.
        task, expired = asyncio.current_task(), []

        def expire() -> None:
            expired.append(True)
            task.cancel()

        late = asyncio.get_running_loop().call_later(self.read_timeout_s, expire)
        chunks, size = [], 0
        try:
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    raise _Gone
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise Refused(413, f"body over {MAX_BODY_BYTES} bytes; at most {MAX_BODY_BYTES}", "too_large")
                if self._buffered + len(chunk) > BODY_BUDGET:
                    raise Refused(503, f"request bodies being read hold {BODY_BUDGET} bytes; retry later", "busy")
                self._buffered += len(chunk)
                chunks.append(chunk)
                if not message.get("more_body"):
                    return b"".join(chunks)
        except asyncio.CancelledError:
            if not expired:  # not our deadline: the server is stopping
                raise
            if hasattr(task, "uncancel"):  # 3.11: the task goes on, to answer 408
                task.uncancel()
            raise Refused(408, f"the body did not arrive within endpoint.read_timeout_s={self.read_timeout_s:g}s",
                          "read_timeout") from None
        finally:
            late.cancel()
            self._buffered -= sum(map(len, chunks))

    def _episode(self, request: HttpRequest, body: dict) -> str:
        """The episode the request's credential speaks for (its bearer key, or its `user` field); Refused."""
        auth = request.headers.get("authorization", "")
        bearer = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        user = body.get("user") if isinstance(body.get("user"), str) else None
        header = request.headers.get("x-episode-id")
        episode = self.keys.verify(bearer) or self.keys.verify(user)
        if episode is None and not (header or user or named(bearer)):
            raise Refused(400, "no episode id: use the client streamrl hands the agent (its api_key is the "
                               "episode's credential), or send that credential in the field 'user'", "no_episode")
        if episode is None or (header and header != episode):
            name = _short(header or user or bearer.rpartition(":")[0])
            raise Refused(401, f"no valid credential for episode {name!r}: only the agent streamrl started for an "
                               "episode may call for it (its client's api_key, or that key in the field 'user')",
                          "unauthorized")
        return episode

    async def _serve(self, kind: str, body: dict, episode: str) -> Response:
        loop = asyncio.get_running_loop()
        answered = loop.create_future()

        def settle() -> None:  # on the runner's thread
            try:
                loop.call_soon_threadsafe(lambda: answered.done() or answered.set_result(None))
            except RuntimeError:  # the loop has stopped: the actor is closing
                pass

        request = Request(kind, body, episode, settle)
        with self._lock:
            if self._closing:
                raise Refused(503, f"{self.actor_id}: the actor is stopping", "stopping")
            self.requests.put(request)
        late = loop.call_later(self.timeout_s, lambda: answered.done() or answered.set_result(None))
        await answered  # the answer, or the deadline
        late.cancel()
        if request.payload is None:
            raise Refused(503, f"not served within {self.timeout_s:g}s (endpoint.request_timeout_s)", "timeout")
        if request.status == 200 and body.get("stream"):
            return Response(replies.stream(kind, body, request.payload), headers={"content-type": "text/event-stream"})
        return _json(request.status, request.payload)


class _Gone(Exception):
    """The client disconnected before its body was read."""
