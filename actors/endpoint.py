"""The actor's OpenAI-compatible endpoint: `/v1/chat/completions`, `/v1/completions` and `/v1/models` over the
standard library's ThreadingHTTPServer, bound to `endpoint.host` (loopback by default).

The server threads never touch the engine. Each request is parsed and checked here, then queued (`take`) for
the actor's episode runner (`streamrl.actors.agents`), which batches the requests of concurrent episodes into
one generate call on the actor's own thread and answers each (`Request.answer`); the server thread waits for
that answer (at most `endpoint.request_timeout_s`, then 503). A request names its episode by the header
`X-Episode-Id` or the body's `user` field; one naming no episode in flight is answered 404. `stream: true`
gets the answer as server-sent events and `n` (at most MAX_N) that many choices (`streamrl.actors.replies`).
Errors use OpenAI's shape: {"error": {"message", "type", "code"}}.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from streamrl.actors import replies

log = logging.getLogger("streamrl.actor")

ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
MAX_BODY_BYTES = 16 << 20
MAX_N = 16


class BadRequest(ValueError):
    """A request the endpoint refuses: its message says what is wrong and what is allowed."""


class Request:
    """One queued model call: kind ('chat' | 'completion'), the JSON body, the episode it belongs to."""

    def __init__(self, kind: str, body: dict, episode_id: str):
        self.kind, self.body, self.episode_id = kind, body, episode_id
        self.status, self.payload = 0, None
        self._done = threading.Event()

    def answer(self, status: int, payload: dict) -> None:
        self.status, self.payload = status, payload
        self._done.set()

    def fail(self, status: int, message: str, code: str) -> None:
        self.answer(status, error(message, code))

    def wait(self, timeout_s: float) -> bool:
        return self._done.wait(timeout_s)


def error(message: str, code: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code}}


def check(kind: str, body) -> None:
    """Raises BadRequest for what the endpoint does not serve (the runner checks the rest against its episode)."""
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(body).__name__}")
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
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and "role" in m
                                                                      for m in messages):
            raise BadRequest("messages: a non-empty list of {'role': ..., 'content': ...}")
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


class _Server(ThreadingHTTPServer):
    # Every episode's client may connect at once (task.agent_workers of them); the default backlog of 5 refuses
    # connections under load, and the client must not retry a model call (it may have been sampled).
    request_queue_size = 1024
    daemon_threads = True


class Endpoint:
    """The server, on its own daemon thread; `take` hands the actor's runner the next request (None on a wake)."""

    def __init__(self, host: str, port: int, request_timeout_s: float, actor_id: str):
        self.requests: queue.Queue[Request | None] = queue.Queue()
        self.timeout_s, self.actor_id = request_timeout_s, actor_id
        self.server = _Server((host, port), _handler(self))
        self.thread = threading.Thread(target=self.server.serve_forever, name=f"{actor_id}-endpoint", daemon=True)
        self.thread.start()
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.server.server_address[1]}/v1"
        log.info("%s: OpenAI-compatible endpoint at %s", actor_id, self.url)

    def take(self, timeout_s: float) -> Request | None:
        try:
            return self.requests.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def wake(self) -> None:
        """Ends a `take` early (an agent returned: the runner has something to settle)."""
        self.requests.put(None)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        while (r := self.take(0)) is not None:  # nobody will serve these any more
            r.fail(503, f"{self.actor_id}: the actor is stopping", "stopping")


def _handler(endpoint: Endpoint):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes: with Nagle's algorithm the body waits for the client's delayed ACK
        # (~40 ms a request on Linux).
        disable_nagle_algorithm = True

        def log_message(self, *args) -> None:  # one line per request would drown the actor's log
            pass

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                return self._send(200, {"object": "list", "data": [{"id": "policy", "object": "model",
                                                                     "owned_by": endpoint.actor_id}]})
            self._send(404, error(f"no route GET {self.path}; GET /v1/models", "not_found"))

        def do_POST(self) -> None:
            kind = ROUTES.get(self.path.rstrip("/"))
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self.close_connection = True
                return self._send(413, error(f"body of {length} bytes; at most {MAX_BODY_BYTES}", "too_large"))
            raw = self.rfile.read(length)
            if kind is None:
                return self._send(404, error(f"no route POST {self.path}; POST {' or '.join(ROUTES)}", "not_found"))
            try:
                body = json.loads(raw)
                check(kind, body)
            except (ValueError, BadRequest) as e:
                return self._send(400, error(f"{self.path}: {e}", "bad_request"))
            episode = self.headers.get("X-Episode-Id") or body.get("user")
            if not episode:
                return self._send(400, error("no episode id: send the header X-Episode-Id or the field 'user' "
                                             "(the client streamrl hands an agent sends it)", "no_episode"))
            request = Request(kind, body, str(episode))
            endpoint.requests.put(request)
            if not request.wait(endpoint.timeout_s):
                return self._send(503, error(f"not served within {endpoint.timeout_s:g}s "
                                             "(endpoint.request_timeout_s)", "timeout"))
            if request.status == 200 and body.get("stream"):
                return self._send(200, None, replies.stream(kind, body, request.payload))
            self._send(request.status, request.payload)

        def _send(self, status: int, payload: dict | None, events: bytes | None = None) -> None:
            data = events if events is not None else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/event-stream" if events is not None else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
