"""Several optimizer steps on one batch (learner.minibatches = k > 1), against one proximal policy.

The batch's groups split into k contiguous minibatches of near-equal size, one optimizer step each, in order,
each normalised by its own share of the batch's token and sample counts. The proximal log-probs are computed
once, with the weights before the first step, and passed to the loss (`proximal_logprobs`): decoupled PPO's clip
then measures how far this batch's own steps have moved the policy (AReaL's `*-4step` configs, Fu et al. 2025),
while the behaviour weight pi_prox / pi_behaviour corrects for the batch's staleness. Strict on-policy mode
refuses k > 1 (streamrl/config/root.py): after the first step the learner is no longer the policy that sampled.

loss.proximal = interpolate skips that forward pass (A-3PO, `interpolation`): each minibatch's proximal log-probs
are interpolated between the behaviour log-probs and the minibatch's own training forward.
"""

from __future__ import annotations

import time

import torch

from streamrl.learner.batch import Batch, micro_batches


def train(engine, batch: Batch, advantages: torch.Tensor, token_count: float | None = None,
          sequence_count: float | None = None, version: int | None = None):
    """k = engine.cfg.learner.minibatches optimizer steps on `batch`, consumed at learner version `version` (needed
    by loss.proximal = interpolate): each minibatch's LossOutput, in row order, and the info of engine.train_step,
    which sums the steps' counts and times (optimizer_steps = k) and averages their losses, gradient norms and step
    scales. advantages: (num_groups, G)."""
    k = engine.cfg.learner.minibatches
    groups = batch.rewards.shape[0]
    if groups < k:
        raise ValueError(f"learner.minibatches={k}: this rank's share of the batch has {groups} groups and each "
                         "minibatch needs at least one (allowed: at most learner.batch_groups / learner ranks)")
    t0 = time.perf_counter()
    bounds = [round(i * groups / k) for i in range(k + 1)]
    parts = [(batch.groups(g0, g1), slice(g0, g1)) for g0, g1 in zip(bounds, bounds[1:])]
    if engine.cfg.loss.proximal == "interpolate":
        proximal = [interpolation(part, j, k, version) for j, (part, _) in enumerate(parts)]
    else:
        proximal = [proximal_logprobs(engine, part) for part, _ in parts]  # every one before the first step
    prox_s = time.perf_counter() - t0
    n_tokens = float(batch.num_tokens if token_count is None else token_count)
    n_seqs = float(batch.input_ids.shape[0] if sequence_count is None else sequence_count)
    local = max(batch.num_tokens, 1)
    outs, infos = [], []
    for (part, g), prox in zip(parts, proximal):
        out, info = engine.optimizer_step(part, advantages[g], n_tokens * part.num_tokens / local,
                                           n_seqs * (g.stop - g.start) / groups, proximal=prox, version=version)
        outs.append(out)
        infos.append(info)
    norms = [i["grad_norm"] for i in infos if i["grad_norm"] is not None]
    return outs, {
        **infos[-1],
        "loss": sum(i["loss"] for i in infos) / k,  # each minibatch's is a mean over its own tokens
        "grad_norm": sum(norms) / len(norms) if norms else None,
        "step_scale": sum(i["step_scale"] for i in infos) / k,
        **{key: sum(i[key] for i in infos)
           for key in ("optimizer_steps", "optimizer_skipped", "micro_batches", "micro_batches_idle", "backward_s",
                       "optimizer_s")},
        "fwd_bwd_s": prox_s + sum(i["fwd_bwd_s"] for i in infos),
    }


@torch.no_grad()
def proximal_logprobs(engine, batch: Batch) -> torch.Tensor:
    """(B, L-1) log-probs of `batch`'s completion tokens under the engine's current weights, on the host (0 off
    the completion mask), through the micro-batches, trims and output-layer chunks of its training forward
    (Engine.optimizer_step), so that before any step they equal that forward's log-probs bit for bit."""
    lengths = batch.attention_mask.sum(-1)
    parts = micro_batches(lengths.tolist(), engine.cfg.learner.micro_batch_tokens)
    chunks = engine.agreed_chunks(batch, parts, lengths)
    out = torch.zeros_like(batch.behaviour_logprobs)
    dev = engine.device
    for i, n in enumerate(chunks):
        idle = i >= len(parts)  # another rank has more micro-batches (ZeRO-3): the same collectives, nothing kept
        rows = slice(0, 1) if idle else parts[i]
        length = int(lengths[rows].max())
        mask = batch.completion_mask[rows, :length - 1].to(dev).bool()
        logp, _ = engine.token_logprobs(engine.engine, batch.input_ids[rows, :length].to(dev),
                                        batch.attention_mask[rows, :length].to(dev),
                                        torch.zeros_like(mask) if idle else mask, chunks=n)
        if not idle:
            out[rows, :length - 1] = logp.float().cpu()
    return out


def interpolation(batch: Batch, j: int, k: int, version: int | None) -> torch.Tensor:
    """(B,) A-3PO's weight α of the current log-probs in minibatch j's proximal log-probs, one per sample:
    log π_prox ≈ log π_behaviour + α (log π_θ - log π_behaviour) (offpolicy.decoupled_ppo's `proximal_alpha`).

    Li, Wu, Shen 2026, "A-3PO: Accelerating Asynchronous LLM Training with Staleness-aware Proximal Policy
    Approximation" (arXiv:2512.06547; AReaL's `prox_logp_method: loglinear`, areal/trainer/ppo/actor.py
    compute_prox_logp_approximations): α = (v_prox - v_behaviour) / (v_θ - v_behaviour), counted in optimizer steps.
    Here the proximal policy is the weights before the batch's first step, minibatch j trains on the weights j steps
    later, and a group generated `lag` versions back was sampled lag·k steps before the proximal: α = lag·k /
    (lag·k + j), and 1 for j = 0, whose proximal policy is the current one exactly."""
    if version is None:
        raise ValueError("loss.proximal=interpolate: the batch's learner version is needed (Engine.train_step "
                         "version=...) to place each sample between its behaviour and the current policy")
    behind = (batch.sample_lags(version) * k).double()  # (B,)
    if j == 0:
        return torch.ones_like(behind)
    return behind / (behind + j)
