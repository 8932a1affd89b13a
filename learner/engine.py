"""The DeepSpeed training engine: log-probs, one optimizer step per batch, full weights, checkpoints.

On CPU it runs on gloo with a client torch AdamW (DeepSpeed's FusedAdam would compile for a
minute); on GPUs it runs on NCCL. Started alone it sets up a one-process group itself; under the
`deepspeed` launcher or `torchrun` it uses their environment.
"""

from __future__ import annotations

import copy
import logging
import os
import socket
import time

import torch

from learner.batch import Batch
from streamrl import losses
from streamrl.config import Config

log = logging.getLogger("streamrl.learner")


def _init_distributed() -> None:
    import deepspeed

    if "RANK" not in os.environ:  # a single process started by hand or by `streamrl run`
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")


def _grad_norm(module: torch.nn.Module) -> float:
    norms = [p.grad.detach().float().norm() for p in module.parameters() if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0


class Engine:
    def __init__(self, cfg: Config, model: torch.nn.Module):
        import deepspeed

        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        _init_distributed()
        self.cfg = cfg
        self.ref_model = copy.deepcopy(model).eval().requires_grad_(False) if cfg.loss.kl_coef else None
        o = cfg.optim
        optimizer = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
        warmup = max(o.warmup_steps, 0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)
        samples = cfg.learner.batch_groups * cfg.actors.group_size
        world = int(os.environ.get("WORLD_SIZE", "1"))
        ds_config = {
            "train_batch_size": samples * world,
            "train_micro_batch_size_per_gpu": samples,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": o.grad_clip,
            "zero_optimization": {"stage": cfg.learner.zero_stage},
            "bf16": {"enabled": cfg.model.dtype == "bfloat16"},
            "fp16": {"enabled": cfg.model.dtype == "float16"},
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config)
        self.device = self.engine.device
        self.rank = self.engine.global_rank
        self._state_vars: dict | None = None

    @property
    def optimizer_steps(self) -> int:
        return int(self.engine.global_steps)

    def token_logprobs(self, module: torch.nn.Module, batch: Batch, with_entropy: bool = False):
        """(B, L-1) log-prob of each next token at the sampling temperature, and optionally entropy."""
        ids = batch.input_ids.to(self.device)
        logits = module(input_ids=ids, attention_mask=batch.attention_mask.to(self.device)).logits
        logits = logits[:, :-1].float() / self.cfg.actors.temperature
        lse = logits.logsumexp(-1)
        logp = logits.gather(-1, ids[:, 1:, None]).squeeze(-1) - lse
        entropy = None
        if with_entropy:
            p = torch.softmax(logits, -1)
            entropy = lse - (p * logits).sum(-1)
        return logp, entropy

    def train_step(self, batch: Batch, advantages: torch.Tensor) -> tuple[losses.LossOutput, dict]:
        """One forward/backward/optimizer step on the whole batch. advantages: (num_groups, G)."""
        lc = self.cfg.loss
        t0 = time.perf_counter()
        self.engine.train()
        logp, entropy = self.token_logprobs(self.engine, batch, with_entropy=bool(lc.entropy_coef))
        ref = None
        if self.ref_model is not None:
            with torch.no_grad():
                ref, _ = self.token_logprobs(self.ref_model.to(self.device), batch)
        out = losses.compute(
            lc.name, logp, batch.behaviour_logprobs.to(self.device), advantages.flatten().to(self.device),
            batch.completion_mask.to(self.device), clip_low=lc.clip_low, clip_high=lc.clip_high, is_cap=lc.is_cap,
            kl_coef=lc.kl_coef, entropy_coef=lc.entropy_coef, ref_logprobs=ref, entropy=entropy)
        self.engine.backward(out.loss)
        t1 = time.perf_counter()
        steps_before = self.optimizer_steps
        # ZeRO-0 leaves full gradients on the module and DeepSpeed reports no norm there.
        local_norm = _grad_norm(self.engine.module) if self.cfg.learner.zero_stage == 0 else None
        self.engine.step()
        t2 = time.perf_counter()
        grad_norm = self.engine.get_global_grad_norm() if local_norm is None else local_norm
        return out, {
            "loss": float(out.loss.detach()),
            "grad_norm": float(grad_norm) if grad_norm is not None else None,
            "lr": float(self.scheduler.get_last_lr()[0]) if self.scheduler else self.cfg.optim.lr,
            "optimizer_steps": self.optimizer_steps - steps_before,
            "fwd_bwd_s": t1 - t0,
            "optimizer_s": t2 - t1,
        }

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """All weights, gathered on every rank (a collective under ZeRO-3: every rank must call it).

        Below ZeRO-3 these are the live parameters, not copies: the next optimizer step changes
        them, so a caller that keeps them past it must copy (WeightPublisher.publish does).
        """
        if self.cfg.learner.zero_stage == 3:
            import deepspeed

            params = list(self.engine.module.parameters())
            with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                return {k: v.detach().cpu().clone() for k, v in self.engine.module.state_dict().items()}
        if self._state_vars is None:
            # state_dict() walks every module (~0.2 ms on the tiny model, more than copying its weights);
            # the Parameter objects stay, and `.data` reads whatever tensor DeepSpeed has put behind them.
            self._state_vars = self.engine.module.state_dict(keep_vars=True)
        return {k: v.data for k, v in self._state_vars.items()}

    def save(self, directory: str, tag: str) -> None:
        """Model, optimizer and scheduler under directory/tag; `latest` is left to learner.checkpoints."""
        self.engine.save_checkpoint(directory, tag=tag, save_latest=False)

    def load(self, directory: str, tag: str) -> None:
        path, _ = self.engine.load_checkpoint(directory, tag=tag)
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load checkpoint {directory}/{tag}")
        self._state_vars = None  # whatever loading replaced, the next publish looks again
        log.info("resumed from %s", path)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
