"""The DeepSpeed training engine: log-probs, a batch's optimizer step(s), full weights, checkpoints.

On CPU it runs on gloo with a client torch AdamW (DeepSpeed's FusedAdam would compile for a
minute); on GPUs it runs on NCCL. Started alone it sets up a one-process group itself; under the
`deepspeed` launcher or `torchrun` it uses their environment.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import socket
import time
from typing import Callable

import torch

from streamrl.algo import learning_signal, losses
from streamrl.config import Config
from streamrl.learner import baseline, logprobs, minibatches, stepsize
from streamrl.learner.batch import Batch, micro_batches
from streamrl.learner.optimizer import AdamW, step_unless_no_gradient

log = logging.getLogger("streamrl.learner")


def _init_distributed(timeout_s: float) -> None:
    import datetime

    import deepspeed

    if "RANK" not in os.environ:  # a single process started by hand or by `streamrl run`
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    _no_shm_comm_op()
    # A timeout on every collective: a rank that died turns into an error, not a silent hang.
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo",
                               timeout=datetime.timedelta(seconds=timeout_s))


def _no_shm_comm_op() -> None:
    """Keep DeepSpeed from building (or, when cached, loading) its shared-memory comm op at init.

    DeepSpeed's torch backend compiles `deepspeed_shm_comm` with a C++ toolchain on first use
    (tens of seconds on a fresh machine, and its compatibility probe runs compiler subprocesses for
    every op even when cached) whenever the accelerator is the CPU. The op serves only
    `inference_all_reduce`, which training never calls: our collectives go through
    torch.distributed. Marking it incompatible before init skips the probe and the build."""
    import deepspeed.ops

    compatible = vars(deepspeed.ops).get("__compatible_ops__")  # newer DeepSpeed probes on first access
    if compatible is None:
        deepspeed.ops.__compatible_ops__ = {"deepspeed_shm_comm": False}
    else:
        compatible["deepspeed_shm_comm"] = False


def _concat(outs: list[losses.LossOutput], width: int) -> losses.LossOutput:
    """Micro-batches' outputs, each (b_i, l_i - 1), as one (B, width) output in row order, on the host.

    The step's records, the strict check and the histograms read them beside the batch's masks, which
    stay on the host: on a GPU, mixing the two failed the first step (tests/gpu/test_learner_step_cuda.py)."""
    def cat(ts: list[torch.Tensor], fill) -> torch.Tensor:
        return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill).cpu() for t in ts])

    return losses.LossOutput(loss=torch.stack([o.loss for o in outs]).sum().cpu(),
                             token_loss=cat([o.token_loss for o in outs], 0.0),
                             ratio=cat([o.ratio for o in outs], 1.0),
                             clipped=cat([o.clipped.to(torch.uint8) for o in outs], 0).bool(),
                             truncated=cat([o.truncated.to(torch.uint8) for o in outs], 0).bool(),
                             masked=cat([o.masked.to(torch.uint8) for o in outs], 0).bool(),
                             weights=cat([o.weights for o in outs], 0.0))


def _grad_norm(module: torch.nn.Module) -> float:
    norms = [p.grad.detach().float().norm() for p in module.parameters() if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0


def recompute_layers_in_backward(model: torch.nn.Module) -> None:
    """Non-reentrant activation checkpointing of every decoder layer. transformers 5.x calls it
    `activation_checkpointing_enable` (the old `gradient_checkpointing_enable` warns that it goes in
    v6), as does the tiny Llama; older transformers have only the old name."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


class Engine:
    def __init__(self, cfg: Config, model: torch.nn.Module):
        import deepspeed

        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        _init_distributed(cfg.learner.collective_timeout_s)
        self.cfg = cfg
        self.drift_scale = 1.0  # optim.target_drift's lr scale, carried from step to step and checkpointed
        self.ref_model = copy.deepcopy(model).eval().requires_grad_(False) if cfg.loss.kl_coef else None
        if cfg.learner.activation_checkpointing:  # recompute each layer's activations in backward
            recompute_layers_in_backward(model)
        o = cfg.optim
        # torch's AdamW, less the torch._dynamo import its first calls would make (1.8 s of start-up); under
        # ZeRO torch's own class, the exact type DeepSpeed's ZeRO optimizers accept
        adamw = AdamW if cfg.learner.zero_stage == 0 else torch.optim.AdamW
        self.lora = cfg.lora.rank > 0
        # LoRA: only the adapters have gradients and optimizer state; the base is frozen (model.build)
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = adamw(trainable, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
        warmup = math.ceil(o.warmup_ratio * cfg.steps) if o.warmup_ratio else o.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: stepsize.lr_factor(step // cfg.learner.minibatches, warmup, cfg.steps, o.schedule))
        samples = cfg.learner.batch_groups * cfg.actors.group_size
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        if cfg.learner.batch_groups % self.world:
            raise ValueError(f"learner.batch_groups={cfg.learner.batch_groups}: must divide by the {self.world} "
                             "learner ranks (each rank trains on an equal share of every batch's groups)")
        ds_config = {
            "train_batch_size": samples,
            "train_micro_batch_size_per_gpu": samples // self.world,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": o.grad_clip,
            "zero_optimization": {"stage": cfg.learner.zero_stage, **(
                {} if cfg.learner.zero3_persistence_threshold is None
                else {"stage3_param_persistence_threshold": cfg.learner.zero3_persistence_threshold})},
            # LoRA keeps the frozen base in model.dtype and trains fp32 adapters: DeepSpeed's half precision
            # would cast the whole module (adapters included) to it
            "bf16": {"enabled": cfg.model.dtype == "bfloat16" and not self.lora},
            "fp16": {"enabled": cfg.model.dtype == "float16" and not self.lora},
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config)
        self.device = self.engine.device
        self.rank = self.engine.global_rank
        self._state_vars: dict | None = None
        self._backward_s = 0.0  # seconds in backward during the current train_step
        self.before_step: Callable[[], None] | None = None
        """Called right before the optimizer changes the parameters in place: the learner sets it to
        WeightPublisher.settle, so a background copy of the previous weights finishes first."""

    @property
    def optimizer_steps(self) -> int:
        return int(self.engine.global_steps)

    def token_logprobs(self, module: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       positions: torch.Tensor, with_entropy: bool = False, chunks: int | None = None):
        """(b, l-1) log-prob of each next token at the sampling temperature where `positions` (b, l-1)
        is true (0 elsewhere), and optionally entropy. `module`: the engine or the reference model.
        chunks: output-layer calls to make (logprobs.token_logprobs), None: as many as the tokens need."""
        model = self.engine.module if module is self.engine else module
        h = logprobs.hidden_states(module, model, input_ids, attention_mask)  # (b, l, H)
        return logprobs.token_logprobs(
            model.get_output_embeddings(), h, input_ids, positions, temperature=self.cfg.actors.temperature,
            chunk_tokens=self.cfg.learner.logprob_chunk_tokens,
            softcap=getattr(model.config, "final_logit_softcapping", None), with_entropy=with_entropy, chunks=chunks)

    def train_step(self, batch: Batch, advantages: torch.Tensor, token_count: float | None = None,
                   sequence_count: float | None = None, version: int | None = None) -> tuple[losses.LossOutput, dict]:
        """learner.minibatches optimizer steps on `batch` (this rank's share of it under data parallelism;
        token_count, sequence_count: the whole batch's completion tokens and samples over the world
        size), consumed at learner version `version`. advantages: (num_groups, G), shifted first by the off-policy
        minimum-variance baseline under loss.variance_control mvb | both (learner/baseline.py). One minibatch (the
        default): `optimizer_step` on the whole batch; k > 1: learner/minibatches.py, against proximal log-probs.
        """
        advantages = baseline.baselined(self, batch, advantages, token_count, sequence_count)
        if self.cfg.learner.minibatches == 1:
            return self.optimizer_step(batch, advantages, token_count, sequence_count, version=version)
        outs, info = minibatches.train(self, batch, advantages, token_count, sequence_count, version)
        return _concat(outs, batch.completion_mask.shape[1]), info

    def optimizer_step(self, batch: Batch, advantages: torch.Tensor, token_count: float | None = None,
                        sequence_count: float | None = None, proximal: torch.Tensor | None = None,
                        version: int | None = None) -> tuple[losses.LossOutput, dict]:
        """One optimizer step on `batch`; proximal: (B, L-1) the loss's proximal log-probs (None: the current);
        version: the learner version the batch is consumed at (its groups' lags, for optim.target_drift).

        The rows go through forward/backward in micro-batches of at most learner.micro_batch_tokens
        padded tokens, accumulating gradients; every micro-batch's loss is normalised by the whole
        batch's token count (loss.aggregation=token) or sample count (sequence), so the update does
        not depend on how the rows were split.
        """
        t0 = time.perf_counter()
        self.engine.train()
        adv = advantages.flatten()  # (B,)
        n_tokens = float(batch.num_tokens if token_count is None else token_count)
        n_seqs = float(batch.input_ids.shape[0] if sequence_count is None else sequence_count)
        lengths = batch.attention_mask.sum(-1)  # rows are right-padded
        parts = micro_batches(lengths.tolist(), self.cfg.learner.micro_batch_tokens)
        chunks = self.agreed_chunks(batch, parts, lengths)
        outs = []
        self._backward_s = 0.0
        for i, n in enumerate(chunks):
            # Gradients reduce across ranks and the optimizer steps only after the last micro-batch.
            self.engine.set_gradient_accumulation_boundary(i == len(chunks) - 1)
            if i < len(parts):
                rows = parts[i]
                outs.append(self._micro_step(batch, rows, int(lengths[rows].max()), adv[rows], n_tokens, n_seqs, n,
                                             proximal=proximal))
            else:  # another rank has more micro-batches: go through the same collectives, adding nothing
                self._micro_step(batch, slice(0, 1), int(lengths[0]), adv[:1], n_tokens, n_seqs, n, idle=True)
        out = _concat(outs, batch.completion_mask.shape[1])
        t1 = time.perf_counter()
        steps_before = self.optimizer_steps
        # ZeRO-0 leaves full gradients on the module and DeepSpeed reports no norm there.
        local_norm = _grad_norm(self.engine.module) if self.cfg.learner.zero_stage == 0 else None
        settle_s, (scale, drift) = 0.0, stepsize.scale_step(self, out, batch, version)
        if self.before_step is not None:
            s0 = time.perf_counter()
            self.before_step()
            settle_s = time.perf_counter() - s0  # the publisher's time, not the optimizer's
        skipped = step_unless_no_gradient(self.engine, self.scheduler, local_norm)
        t2 = time.perf_counter()
        grad_norm = self.engine.get_global_grad_norm() if local_norm is None else local_norm
        return out, {
            "loss": float(out.loss),
            "grad_norm": float(grad_norm) if grad_norm is not None else None,
            "lr": float(self.scheduler.get_last_lr()[0]) if self.scheduler else self.cfg.optim.lr,
            "step_scale": scale, "drift_per_version": drift,
            "optimizer_steps": self.optimizer_steps - steps_before, "optimizer_skipped": int(skipped),
            "micro_batches": len(parts),
            "micro_batches_idle": len(chunks) - len(parts),
            "fwd_bwd_s": t1 - t0,
            # of which backward (DeepSpeed's backward: autograd, and gradient reduction across ranks);
            # the rest is forward, log-probs and loss
            "backward_s": self._backward_s,
            "optimizer_s": t2 - t1 - settle_s,
        }

    def agreed_chunks(self, batch: Batch, parts: list[slice], lengths: torch.Tensor) -> list[int]:
        """Log-prob chunks of each micro-batch, agreed by all ranks: one entry per micro-batch of the rank
        with the most, each the most any rank needs for that micro-batch.

        Under ZeRO-3 every forward gathers every layer's parameters, and every output-layer call (one per
        chunk, again in backward) gathers its weight: collectives that each rank must enter equally often.
        A rank's counts follow its own share of tokens, so two ranks would disagree; with persistence
        threshold 0, two gloo ranks abort on the first mismatched gather ("Received data size doesn't match
        expected size", tests/integration/test_zero3_counts.py), and NCCL would hang or read wrong data.
        Below ZeRO-3 nothing is gathered in forward or backward: each rank keeps its own counts."""
        chunk = self.cfg.learner.logprob_chunk_tokens
        own = [logprobs.chunk_count(int(batch.completion_mask[rows, :int(lengths[rows].max()) - 1].sum()), chunk)
               for rows in parts]
        if self.cfg.learner.zero_stage != 3 or self.world == 1:
            return own
        import torch.distributed as dist

        count = torch.tensor([len(own)], dtype=torch.int64, device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        agreed = torch.zeros(int(count), dtype=torch.int64, device=self.device)
        agreed[:len(own)] = torch.tensor(own, dtype=torch.int64)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        return agreed.tolist()

    def _micro_step(self, batch: Batch, rows: slice, length: int, adv: torch.Tensor,
                    n_tokens: float, n_seqs: float, chunks: int | None = None,
                    idle: bool = False, proximal: torch.Tensor | None = None) -> losses.LossOutput:
        """Forward and backward on `rows` of the batch, trimmed to their longest row (`length`), with
        `chunks` output-layer calls. idle: no position counts (a zero loss with zero gradients), for a
        rank that has fewer micro-batches than another under ZeRO-3. proximal: (B, L-1) log-probs,
        (B,) A-3PO's interpolation weights (minibatches.train), or None."""
        lc, dev = self.cfg.loss, self.device
        ids = batch.input_ids[rows, :length].to(dev)
        attn = batch.attention_mask[rows, :length].to(dev)
        mask = batch.completion_mask[rows, :length - 1].to(dev)
        if idle:
            mask = torch.zeros_like(mask)
        positions = mask.bool()
        logp, entropy = self.token_logprobs(self.engine, ids, attn, positions, with_entropy=bool(lc.entropy_coef),
                                            chunks=chunks)
        ref = None
        if self.ref_model is not None:
            with torch.no_grad():
                ref, _ = self.token_logprobs(self.ref_model.to(dev), ids, attn, positions)
        behaviour = batch.behaviour_logprobs[rows, :length - 1].to(dev)
        # Strict mode has proved (check_strict) that the actors sampled from these weights, so the objective
        # sees behaviour = current: every importance weight is exactly 1, not 1 ± the engines' rounding. The
        # check itself reads the ratio against the actors' log-probs, reported below.
        seen = logp.detach() if self.cfg.on_policy == "strict" else behaviour
        knobs = lc.objective_knobs()
        if proximal is not None:  # only objectives that name it take it (losses.compute)
            p = proximal[rows].to(dev)
            if p.dim() == 1:
                knobs["proximal_alpha"] = p
            else:
                knobs["proximal_logprobs"] = p[:, :length - 1]
        out = losses.compute(lc.name, logp, seen, adv.to(dev), mask, **knobs, ref_logprobs=ref, entropy=entropy,
                             token_count=n_tokens, sequence_count=n_seqs).filled(mask)
        t0 = time.perf_counter()
        self.engine.backward(out.loss)
        self._backward_s += time.perf_counter() - t0
        ratio = losses.importance_ratio(logp.detach(), behaviour) if seen is not behaviour else out.ratio
        return losses.LossOutput(loss=out.loss.detach(), token_loss=out.token_loss, ratio=ratio,
                                 clipped=out.clipped, truncated=out.truncated, masked=out.masked, weights=out.weights)

    def weight_stats(self) -> dict[str, float]:
        """learning_signal.weight_stats over every parameter, streamed: no copy of the weights.

        Under ZeRO-3 each rank reads only its own shard of each parameter and the passes' aggregates
        are all-reduced, so nothing is gathered; every rank must call it at the same step.
        """
        if self.cfg.learner.zero_stage != 3:
            return learning_signal.weight_stats(list(self.engine.module.parameters()))
        import torch.distributed as dist

        rank = dist.get_rank()
        ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}

        def shards():
            for p in self.engine.module.parameters():
                size = p.ds_tensor.ds_numel  # each rank holds [rank·size, (rank+1)·size) of the flat parameter,
                valid = max(0, min(size, p.ds_numel - rank * size))  # the last one padded beyond ds_numel
                yield p.ds_tensor.reshape(-1)[:valid]

        def reduce(t: torch.Tensor, op: str) -> torch.Tensor:
            dist.all_reduce(t, op=ops[op])
            return t

        return learning_signal.weight_stats(shards, reduce)

    def published_state(self) -> dict[str, torch.Tensor]:
        """What a version carries: the LoRA adapters only (nothing of the frozen base is gathered or
        copied), or all weights without LoRA. A collective under ZeRO-3, as full_state_dict."""
        if not self.lora:
            return self.full_state_dict()
        from streamrl.models.lora import is_adapter

        return self.full_state_dict(is_adapter)

    def full_state_dict(self, only: Callable[[str], bool] | None = None) -> dict[str, torch.Tensor]:
        """All weights (`only`: those whose name it accepts). Under ZeRO-3 a collective (every rank must call it): each parameter is
        gathered in turn and only rank 0 copies it to the CPU, so no rank ever holds a full copy
        beyond rank 0's result (the others get {}).

        Below ZeRO-3 these are the live parameters, not copies: the next optimizer step changes
        them, so a caller that keeps them past it must copy (WeightPublisher.publish does).
        """
        if self.cfg.learner.zero_stage == 3:
            import deepspeed

            state: dict[str, torch.Tensor] = {}
            copies: dict[int, torch.Tensor] = {}  # tied weights: one gather and one copy
            for name, t in self.engine.module.state_dict(keep_vars=True).items():
                if only is not None and not only(name):
                    continue
                if id(t) not in copies:
                    if hasattr(t, "ds_id"):  # a partitioned parameter
                        with deepspeed.zero.GatheredParameters([t], modifier_rank=None):
                            copies[id(t)] = t.detach().cpu().clone() if self.rank == 0 else t.new_empty(0)
                    else:
                        copies[id(t)] = t.detach().cpu().clone()
                if self.rank == 0:
                    state[name] = copies[id(t)]
            return state
        if self._state_vars is None:
            # state_dict() walks every module (~0.2 ms on the tiny model, more than copying its weights);
            # the Parameter objects stay, and `.data` reads whatever tensor DeepSpeed has put behind them.
            self._state_vars = self.engine.module.state_dict(keep_vars=True)
        return {k: v.data for k, v in self._state_vars.items() if only is None or only(k)}

    def save(self, directory: str, tag: str) -> None:
        """Model, optimizer and scheduler under directory/tag; `latest` is left to learner.checkpoints."""
        # LoRA: the frozen base is not saved (model.build makes it again from model.path or the seed)
        self.engine.save_checkpoint(directory, tag=tag, save_latest=False, exclude_frozen_parameters=self.lora,
                                    client_state={"drift_scale": self.drift_scale})
        if self.world > 1:  # every rank's shard is on disk before rank 0 marks the checkpoint complete
            import torch.distributed as dist

            dist.barrier()

    def load(self, directory: str, tag: str) -> None:
        path, client = self.engine.load_checkpoint(directory, tag=tag, load_module_strict=not self.lora)
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load checkpoint {directory}/{tag}")
        self.drift_scale = float((client or {}).get("drift_scale", 1.0))  # (1.0: a checkpoint from before the bound)
        self._state_vars = None  # whatever loading replaced, the next publish looks again
        self._apply_optim_settings()
        log.info("resumed from %s", path)

    def _apply_optim_settings(self) -> None:
        """The loaded optimizer and scheduler states carry the earlier run's lr, betas and weight decay: a resume
        trains with this config's (streamrl.run.fingerprint states the change), at the restored schedule position."""
        o = self.cfg.optim
        for group in self.optimizer.param_groups:
            group.update(initial_lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
        if self.scheduler is not None:
            self.scheduler.base_lrs = [o.lr for _ in self.optimizer.param_groups]
            stepsize.set_lr(self.optimizer, self.scheduler)
            self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
