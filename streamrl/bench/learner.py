"""`streamrl bench learner`: the learner's optimizer step at release shape against plain torch.

The model is shaped like the release folder (`streamrl.models.release_model`: Qwen3 architecture, 151,936
vocabulary, untied output layer; fp32 on CPU). One batch of groups (prompt and completion lengths
drawn at random) goes through the learner's own path — `learner.engine.Engine.train_step`: DeepSpeed,
the micro-batches of `learner.micro_batch_tokens`, chunked log-probs of the completion positions only
— and through two references over the same micro-batches, each with its own copy of the same
initial weights, interleaved round by round in one process:

- plain: the model's forward with its logits, log-softmax over the vocabulary, gather, the same
  loss, backward, gradient clipping, torch AdamW: what a training loop written directly in torch does;
- lean: the same, but the output layer applied only at the completion positions (no chunks, no
  recomputation, no DeepSpeed): the least work the step can do, a bound rather than a peer.

A second row times the log-prob kernel alone on one chunk of the output layer, forward and
backward, as the learner computes it (`learner.logprobs._chunk`: fused log-softmax, then gather)
against the formulation it replaced (gather minus logsumexp, after dividing by the temperature).

Reported: the learner's completion tokens/s and its ratio to each reference (time of the
reference / time of the learner), the median of the rounds, and the loss each path computed on
the first batch (the same weights and batch: they must agree).

It runs where the learner trains: on a CUDA GPU when there is one (DeepSpeed's accelerator), in bf16 there (the
references in fp32 weights under bf16 autocast, as a plain torch loop is written), and there it also reports the
model FLOPs utilisation and the learner's peak memory against `streamrl plan`'s estimate. `--shape qwen3-0.6b`
takes Qwen3-0.6B's decoder (752M parameters) instead of the release folder's small one (issue 49).
"""

from __future__ import annotations

import copy
import statistics
import time

import torch

from streamrl.config import Config


PEAK_BF16_FLOPS = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}
"""Dense bf16 peak per second by GPU name (NVIDIA's data sheets, SXM parts, no sparsity): the MFU's denominator."""


def _model(seed: int = 0, shape: str = "release"):
    """A random-init Qwen3ForCausalLM of the release folder's config at `shape` (fp32), without writing the folder."""
    from transformers import Qwen3ForCausalLM

    from streamrl.models.release_model import model_config

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Qwen3ForCausalLM(model_config(shape)).float()


def train_flops(model, batch) -> float:
    """FLOPs of one training step's useful work (forward + backward = 6 per parameter and token): the decoder's
    parameters (all but the embedding and the output layer) over every real token, and the output layer over the
    completion positions only, where log-probs are needed. Attention's seq² term is left out (it is under 1% at
    these lengths: 2·L·d per token and layer against 12·d² of the weights)."""
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    decoder = sum(p.numel() for p in model.parameters()) - embed.numel() - head.numel()
    real, completion = int(batch.attention_mask.sum()), int(batch.completion_mask.sum())
    return 6.0 * (decoder * real + head.numel() * completion)


def _batch(groups: int, group_size: int, prompt: tuple[int, int], completion: tuple[int, int], vocab: int,
           seed: int = 0):
    """The learner's Batch (through its own collate) of random groups; behaviour log-probs near a
    random-init model's (≈ -ln V), so importance ratios sit near 1 as on-policy."""
    import numpy as np

    from streamrl.comm.codec import ScoredGroup
    from streamrl.learner.batch import collate

    rng = np.random.default_rng(seed)
    made = []
    for g in range(groups):
        lens = rng.integers(completion[0], completion[1] + 1, group_size)
        made.append(ScoredGroup.from_samples(
            prompt_id=f"p{g}", policy_version=0, actor_id="bench",
            prompt_tokens=rng.integers(0, vocab, int(rng.integers(prompt[0], prompt[1] + 1))),
            completions=[rng.integers(0, vocab, n) for n in lens],
            logprobs=[-np.log(vocab) + 0.01 * rng.standard_normal(n) for n in lens],
            rewards=rng.random(group_size), finish_reasons=["length"] * group_size))
    return collate(made, pad_id=0)


def _reference_step(model, optimizer, cfg: Config, batch, adv: torch.Tensor, lean: bool) -> float:
    """One plain-torch optimizer step over the learner's micro-batches of `batch`; returns the loss.

    lean: project only the completion positions onto the vocabulary (else: the model's full logits). On CUDA the
    forward and backward run under bf16 autocast."""
    from streamrl.learner.batch import micro_batches

    lc, T = cfg.loss, cfg.actors.temperature
    lengths = batch.attention_mask.sum(-1)
    n_tokens = float(batch.num_tokens)
    dev = next(model.parameters()).device
    flat_adv = adv.flatten().to(dev)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda")
    total = 0.0
    for rows in micro_batches(lengths.tolist(), cfg.learner.micro_batch_tokens):
        length = int(lengths[rows].max())
        ids, attn = batch.input_ids[rows, :length].to(dev), batch.attention_mask[rows, :length].to(dev)
        mask = batch.completion_mask[rows, :length - 1].to(dev)
        with autocast:
            total += _reference_loss(model, lc, T, ids, attn, mask, batch.behaviour_logprobs[rows, :length - 1].to(dev),
                                     flat_adv[rows], n_tokens, float(batch.input_ids.shape[0]), lean)
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def _reference_loss(model, lc, T: float, ids, attn, mask, behaviour, adv, n_tokens: float, n_seqs: float,
                    lean: bool) -> float:
    """One micro-batch's loss, backward done; ids, attn (b, l), mask, behaviour (b, l-1), adv (b,)."""
    from streamrl.algo import losses

    if lean:
        h = model.model(input_ids=ids, attention_mask=attn).last_hidden_state[:, :-1]  # (b, l-1, H)
        where = mask.bool()
        logits = model.lm_head(h[where]).float()  # (n, V)
        logits = logits / T if T != 1.0 else logits
        picked = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:][where][:, None]).squeeze(-1)
        logp = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).index_put(
            where.nonzero(as_tuple=True), picked.float())
    else:
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float() / T  # (b, l-1, V)
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    out = losses.compute(lc.name, logp, behaviour, adv, mask, clip_low=lc.clip_low, clip_high=lc.clip_high,
                         is_cap=lc.is_cap, token_count=n_tokens, aggregation=lc.aggregation,
                         sequence_count=n_seqs)
    out.loss.backward()
    return float(out.loss.detach())


def _logsumexp_chunk(lm_head, h, targets, temperature: float, softcap, with_entropy: bool):
    """The log-prob kernel learner.logprobs used before (the reference of the chunk row)."""
    logits = lm_head(h).float() / temperature
    return logits.gather(-1, targets[:, None]).squeeze(-1) - logits.logsumexp(-1), None


def _device_figures(cfg: Config, shape: str, batch, flops: float, step_s: float, peak: int | None) -> dict:
    """Where the learner's step ran and its FLOP rate; on a GPU (peak: its peak allocation, bytes) also the MFU
    against the card's bf16 peak and the peak memory against `streamrl plan`'s estimate."""
    device = torch.cuda.get_device_name() if peak is not None else "cpu"
    row = {"device": device.replace(" ", "_"), "shape": shape, "flops_per_step": flops,
           "achieved_tflops": flops / step_s / 1e12}
    if peak is None:
        return row
    peak_flops = next((f for name, f in PEAK_BF16_FLOPS.items() if name in device), None)
    return {**row, "mfu": None if peak_flops is None else flops / step_s / peak_flops, "peak_flops": peak_flops,
            "peak_gb": peak / 1e9, "plan_gb": _plan_bytes(cfg, shape, batch.input_ids.shape[1]) / 1e9}


def _plan_bytes(cfg: Config, shape: str, seq: int) -> int:
    """`streamrl plan`'s learner estimate per GPU for this model and batch (padded to `seq` tokens)."""
    import tempfile

    from streamrl.commands import plan
    from streamrl.models.release_model import model_config

    with tempfile.TemporaryDirectory() as d:
        model_config(shape).save_pretrained(d)
        s = plan.shape(cfg, f"{d}/config.json")
    return plan.learner_part(cfg, s, seq, None).per_gpu


def chunk_row(short: bool) -> dict:
    """Forward + backward of one chunk of tokens through the release-shaped output layer: the learner's
    kernel against the one it replaced, alternated, median of the rounds."""
    from streamrl.learner.logprobs import _chunk
    from streamrl.models.release_model import SHAPE, VOCAB_SIZE

    n, rounds = (64, 3) if short else (256, 9)
    g = torch.Generator().manual_seed(0)
    lm_head = torch.nn.Linear(SHAPE["hidden_size"], VOCAB_SIZE, bias=False)
    h = torch.randn(n, SHAPE["hidden_size"], generator=g, requires_grad=True)
    targets = torch.randint(0, VOCAB_SIZE, (n,), generator=g)
    times: dict[str, list[float]] = {"new": [], "old": []}
    for r in range(rounds + 1):
        for name, fn in (("new", _chunk), ("old", _logsumexp_chunk)):
            t0 = time.perf_counter()
            fn(lm_head, h, targets, 1.0, None, False)[0].sum().backward()
            if r:
                times[name].append(time.perf_counter() - t0)
            h.grad = lm_head.weight.grad = None
    new, old = statistics.median(times["new"]), statistics.median(times["old"])
    return {"bench": "learner_logprob_chunk", "tokens": n, "vocab": VOCAB_SIZE, "rounds": rounds,
            "ms": 1e3 * new, "replaced_ms": 1e3 * old, "speedup": old / new}


def learner(short: bool = False, shape: str = "release") -> list[dict]:
    """The learner's step against plain and lean torch steps, interleaved (see the module docstring); shape: the
    decoder's (streamrl.models.release_model.SHAPES)."""
    from streamrl import config
    from streamrl.learner.engine import Engine

    cuda = torch.cuda.is_available()  # DeepSpeed's accelerator puts the learner there: the references follow
    groups, group_size, micro, rounds = (2, 4, 128, 2) if short else (2, 8, 256, 5)
    prompt, completion = ((8, 16), (4, 12)) if short else ((16, 32), (8, 48))
    cfg = config.load(None, [f"learner.batch_groups={groups}", f"actors.group_size={group_size}",
                             f"learner.micro_batch_tokens={micro}", *(["model.dtype=bfloat16"] if cuda else [])])
    torch.set_num_threads(cfg.learner.threads or torch.get_num_threads())  # as the learner runs
    model = _model(shape=shape)
    batch = _batch(groups, group_size, prompt, completion, model.config.vocab_size)
    adv = torch.randn(groups, group_size, generator=torch.Generator().manual_seed(1))
    o = cfg.optim
    refs = {}
    for name in ("plain", "lean"):
        m = copy.deepcopy(model).train().to("cuda" if cuda else "cpu")
        refs[name] = (m, torch.optim.AdamW(m.parameters(), lr=o.lr, betas=o.betas, weight_decay=o.weight_decay))
    flops = train_flops(model, batch)
    engine = Engine(cfg, model)
    try:
        times: dict[str, list[float]] = {"learner": [], "plain": [], "lean": []}
        first_loss: dict[str, float] = {}
        peak = 0  # bytes: the learner's step's peak CUDA allocation (the references' models live beside it)
        for r in range(rounds + 1):  # round 0 warms up every path (allocator, DeepSpeed's first step)
            for name in ("learner", "plain", "lean"):
                if cuda and name == "learner":
                    torch.cuda.reset_peak_memory_stats()
                t0 = time.perf_counter()
                if name == "learner":
                    out, train = engine.train_step(batch, adv)
                    loss, micro_batches = float(out.loss), train["micro_batches"]
                else:
                    loss = _reference_step(*refs[name], cfg, batch, adv, lean=name == "lean")
                if cuda:
                    torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                if cuda and name == "learner":
                    peak = max(peak, torch.cuda.max_memory_allocated())
                if r == 0:
                    first_loss[name] = loss
                else:
                    times[name].append(dt)
    finally:
        engine.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    tokens = batch.num_tokens
    return [{"bench": "learner", **_device_figures(cfg, shape, batch, flops, med["learner"], peak if cuda else None),
             "params": sum(p.numel() for p in model.parameters()),
             "vocab": model.config.vocab_size, "rows": batch.input_ids.shape[0],
             "completion_tokens": tokens, "padded_len": batch.input_ids.shape[1], "micro_batches": micro_batches,
             "rounds": rounds, "learner_tokens_per_s": tokens / med["learner"],
             "plain_tokens_per_s": tokens / med["plain"], "lean_tokens_per_s": tokens / med["lean"],
             "ratio_vs_plain": med["plain"] / med["learner"], "ratio_vs_lean": med["lean"] / med["learner"],
             "ratio_vs_plain_min": min(p / l for p, l in zip(times["plain"], times["learner"])),
             "loss_diff_plain": abs(first_loss["learner"] - first_loss["plain"]),
             "loss_diff_lean": abs(first_loss["learner"] - first_loss["lean"])}, chunk_row(short)]
