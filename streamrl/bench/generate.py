"""`streamrl bench generate`: the hf actor's sampling loop against transformers' `generate`.

Both draw from the default job's model (the tiny random-init Llama) with the same seed per call:
`streamrl.models.sampling.generate` (the lean loop over the model's forward and KV cache the actors and
evaluation use, on `streamrl.models.tiny_llama`'s plain-torch model as they run it) and
`streamrl.models.sampling.generate_hf` (the same batch through `model.generate`, which the lean loop replaced,
on transformers' LlamaForCausalLM holding the same weights), alternated call by call, so load on the
machine falls on both alike.
Reported per shape: ms per call of each, the speed-up (generate's time / the lean loop's), and
whether every call drew the same completions (tokens, log-probs, finish reasons) on both paths.
"""

from __future__ import annotations

import random
import statistics
import time

import torch

# (name, prompts per call, samples per prompt, max new tokens): the default job's call, and longer completions.
SHAPES = [("default", 4, 8, 4), ("32 tokens", 4, 8, 32)]


def generate(short: bool = False) -> list[dict]:
    from streamrl import config
    from streamrl.models import model as model_lib
    from streamrl.models import prompting, sampling
    from streamrl.models.tiny_llama import to_transformers
    from streamrl.tasks import rewards

    cfg = config.load(None)
    torch.set_num_threads(cfg.actors.threads or torch.get_num_threads())  # as an actor runs
    reward = rewards.build(cfg)
    model, tok = model_lib.build(cfg, reward.task.vocabulary)
    model.eval()
    # generate_hf needs transformers' model: the tiny default's twin, same weights (a release model is one already)
    reference = model if hasattr(model, "generate") else to_transformers(model).eval()
    chat = prompting.uses_chat_template(tok, cfg.model.chat_template)
    eos = model_lib.end_token_ids(model, tok)
    calls = 3 if short else 40
    rows = []
    for name, k, n, new_tokens in SHAPES[:1] if short else SHAPES:
        rng = random.Random(0)
        times: dict[str, list[float]] = {"hf": [], "lean": []}
        same = True
        for call in range(calls + 1):  # call 0 warms both paths up
            prompts = [prompting.encode(tok, reward.task.sample(rng).text, chat, cfg.model.enable_thinking)
                       for _ in range(k)]
            drawn = {}
            for path, fn, m in (("hf", sampling.generate_hf, reference), ("lean", sampling.generate, model)):
                torch.manual_seed(call)
                t0 = time.perf_counter()
                drawn[path] = fn(m, prompts, n, temperature=cfg.actors.temperature, top_p=cfg.actors.top_p,
                                 max_new_tokens=new_tokens, pad_id=tok.pad_token_id, eos_id=eos)
                if call:
                    times[path].append(time.perf_counter() - t0)
            same = same and drawn["hf"] == drawn["lean"]
        hf, lean = statistics.median(times["hf"]), statistics.median(times["lean"])
        rows.append({"bench": "generate", "shape": name, "rows": k * n, "max_new_tokens": new_tokens,
                     "calls": calls, "generate_ms": 1e3 * hf, "lean_ms": 1e3 * lean, "speedup": hf / lean,
                     "same_samples": same})
    return rows
