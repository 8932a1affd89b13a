"""`streamrl bench endpoint`: the actor's OpenAI-compatible endpoint (agent episodes, `streamrl.actors.agents`)
against calling its engine directly, the same prompts in the same run on the tiny model.

One request at a time (task.agent_workers 1): each is an agent's single chat call through the real `openai`
client, HTTP on loopback, the episode's bookkeeping, against one `backend.generate` of the same rendered prompt.
Sixteen at a time: sixteen agents whose requests the actor batches, against one generate call of sixteen.
Reported per request; the ratio is endpoint over direct."""

from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path


def one_call(client, row: dict) -> float:
    """The bench's agent: one chat call, reward 0 (the figure is the time)."""
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
    return 0.0


def endpoint(short: bool = False) -> list[dict]:
    from streamrl import config
    from streamrl.actors import backends
    from streamrl.actors.agents import AgentEpisodes
    from streamrl.models import model as model_lib
    from streamrl.models.conversation import Renderer
    from streamrl.tasks import rewards

    import torch

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "copy.jsonl"
        rng = random.Random(0)
        data.write_text("".join(json.dumps({"prompt": "copy : " + " ".join(rng.choice("abcd") for _ in range(4)) + " ="})
                                + "\n" for _ in range(64)))
        for concurrency in (1, 16):
            cfg = config.load("tiny.yaml", ["task.name=agent", f"task.data={data}", "task.reward_levels=[0.0,1.0]", "advantage.r_min_correct=1.0",
                                            f"task.agent={__name__}:one_call", f"task.agent_workers={concurrency}",
                                            "actors.group_size=2", f"run_dir={tmp}"])
            torch.set_num_threads(cfg.actors.threads)  # as the actor does (agents' threads share its cores)
            reward = rewards.build(cfg)
            model, tok = model_lib.build(cfg, reward.task.vocabulary)
            backend = backends.build("hf", cfg, model, tok)
            runner = AgentEpisodes(cfg, 0, backend, tok, reward, "bench", backend.eos_ids)
            renderer = Renderer(tok, cfg.model.chat_template, cfg.model.enable_thinking)
            prompts = [reward.task.prompt(r) for r in reward.task.train[:16 if short else 64]]
            ids = [renderer.ids(renderer.text([{"role": "user", "content": p.text}], True)) for p in prompts]
            try:
                runner.make_groups(prompts[:2], 0)  # warm: the first generate and the first connection
                t0 = time.perf_counter()
                for k in range(0, len(prompts), 8):
                    runner.make_groups(prompts[k:k + 8], 0)  # 8 prompts x G=2: 16 requests per call
                via_endpoint = (time.perf_counter() - t0) / (2 * len(prompts))
            finally:
                runner.close()
            batch = [i for i in ids for _ in range(2)]  # the same prompts, G=2 each
            t0 = time.perf_counter()
            for k in range(0, len(batch), concurrency):
                backend.generate(batch[k:k + concurrency], 1)
            direct = (time.perf_counter() - t0) / len(batch)
            rows.append({"bench": "endpoint", "concurrency": concurrency, "requests": len(batch),
                         "direct_ms": direct * 1e3, "endpoint_ms": via_endpoint * 1e3,
                         "overhead_ms": (via_endpoint - direct) * 1e3, "ratio_vs_direct": via_endpoint / direct})
    return rows
