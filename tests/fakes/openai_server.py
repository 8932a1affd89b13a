"""A small real HTTP server on loopback that speaks the OpenAI chat-completions API, for the grader's tests.

What it is: `http.server` answering POST /v1/chat/completions with a `chat.completion` JSON body, whose message
content comes from a Python function of the request (`reply(request_json) -> str`), after an optional delay,
or with a scripted HTTP status. It honours vLLM's `structured_outputs.choice` only by refusing (400) a reply
outside the choices, as a stand-in for the constraint (it has no model to constrain). What it is not: a model or
vLLM; the `vllm`-marked test uses a real `vllm serve` for that. It records every request and the most requests
it had in flight at once, and it can be stopped and started again on the same port.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ChatServer:
    def __init__(self, reply: Callable[[dict], str], port: int = 0, delay_s: float = 0.0,
                 accept_structured_outputs: bool = True):
        self.reply = reply
        self.delay_s = delay_s
        self.status: int | None = None  # set: every request answers this HTTP status
        self.status_times: int | None = None  # set: `status` answers this many requests more, then clears
        self.accept_structured_outputs = accept_structured_outputs
        self.requests: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._port = port
        self._httpd: ThreadingHTTPServer | None = None
        self._conns: set[socket.socket] = set()

    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._port}/v1"

    def start(self) -> ChatServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the openai client's connection pool expects

            def log_message(self, *args):
                pass

            def setup(self):
                super().setup()
                with server._lock:
                    server._conns.add(self.connection)

            def finish(self):
                with server._lock:
                    server._conns.discard(self.connection)
                super().finish()

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                with server._lock:
                    server.requests.append(body)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    if server.delay_s:
                        time.sleep(server.delay_s)
                    if server.status is not None:
                        status = server.status
                        if server.status_times is not None:
                            server.status_times -= 1
                            if server.status_times <= 0:
                                server.status, server.status_times = None, None
                        return self._send(status, {"error": {"message": "scripted status"}})
                    so = body.get("structured_outputs")
                    if so is not None and not server.accept_structured_outputs:
                        return self._send(400, {"error": {"message": "Unrecognized request argument: "
                                                                     "structured_outputs"}})
                    content = server.reply(body)
                    if so and "choice" in so and content not in so["choice"]:
                        return self._send(400, {"error": {"message": f"reply {content!r} outside choice"}})
                    self._send(200, {
                        "id": f"chatcmpl-{len(server.requests)}", "object": "chat.completion",
                        "created": int(time.time()), "model": body.get("model", ""),
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": content}}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
                finally:
                    with server._lock:
                        server.in_flight -= 1

        self._httpd = ThreadingHTTPServer(("127.0.0.1", self._port), Handler)
        self._httpd.daemon_threads = True
        self._port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stops listening and drops every open connection (kept-alive ones too), as a killed server would."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
