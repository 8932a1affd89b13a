"""The `endpoint` section: the OpenAI-compatible endpoint each actor serves over its own engine (agent tasks)."""

from __future__ import annotations

from streamrl.config.base import NonNegInt, PositiveFloat, _Section


class EndpointConfig(_Section):
    host: str = "127.0.0.1"
    """Address the actor's /v1/chat/completions and /v1/completions bind (loopback: only agents on its machine)."""
    port: NonNegInt = 0
    """First port: actor i serves on port + i; 0: a free port each (the agent's client is handed the address)."""
    request_timeout_s: PositiveFloat = 120.0
    """Longest a request may wait for its turn on the engine before it is answered 503."""
    read_timeout_s: PositiveFloat = 10.0
    """Longest a request's headers, and then its body, may take to arrive (else 408, or the connection is closed)."""
    batch_window_s: PositiveFloat = 0.005
    """After each request, how long the actor waits for other episodes' to batch them in one generate call."""
    record_turns: bool = False
    """Write every model turn (episode id, prompt ids, completion ids, log-probs, version) to run_dir/name/agent_turns/."""
