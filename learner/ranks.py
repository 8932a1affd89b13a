"""Data parallelism over learner ranks: rank 0 alone speaks ZeroMQ; every rank trains on a share.

Rank 0 receives, gates, batches and computes advantages, then broadcasts the batch. Each rank
trains on its contiguous share of the groups (DeepSpeed averages the gradients), and rank 0
gathers the per-token outputs back for the step's metrics. Everything else a rank does in
lockstep (publishing under ZeRO-3, weight statistics, checkpoints) follows the step number, so
the only message is a command before each step: train, or stop (with or without a last checkpoint).
With one rank every method is a plain call and nothing is sent.
"""

from __future__ import annotations

import msgspec
import torch

from streamrl.algo.losses import LossOutput
from streamrl.comm.weights.collective import (
    collective_device,  # one rule for every collective: nccl takes CUDA tensors, gloo CPU
)
from streamrl.learner.batch import Batch

STOP, STEP, STOP_AND_SAVE = 0, 1, 2


class Command(msgspec.Struct, frozen=True):
    kind: int
    shape: tuple[int, int, int, int] = (0, 0, 0, 0)
    """Batch rows B, sequence length L, groups, group size G."""
    version: int = 0
    """The learner version the batch is consumed at (Engine.train_step's `version`)."""


class Ranks:
    def __init__(self, world: int, rank: int, device: torch.device | str = "cpu"):
        self.world, self.rank = world, rank
        self.device = torch.device(device)
        """Where every tensor this class sends or receives lives (see collective_device)."""

    @classmethod
    def current(cls) -> "Ranks":
        import torch.distributed as dist

        if dist.is_initialized():
            return cls(dist.get_world_size(), dist.get_rank(), collective_device(dist.get_backend()))
        return cls(1, 0)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    # --- rank 0 -------------------------------------------------------------------------------

    def train_step(self, engine, batch: Batch, adv: torch.Tensor, version: int | None = None
                   ) -> tuple[LossOutput, dict]:
        """engine.train_step on the whole batch consumed at learner `version`, spread over the ranks; outputs cover
        the whole batch."""
        if self.world == 1:
            return engine.train_step(batch, adv, version=version)
        self._send(Command(STEP, batch.shape, version or 0))
        sent = Batch(*(self._broadcast(t.contiguous().to(self.device)) for t in batch.tensors()))
        out, train = self._local_step(engine, sent, self._broadcast(adv.contiguous().to(self.device)), version)
        full = self._gather(out)
        return full, {**train, "loss": float(full.loss)}

    def stop(self, save: bool) -> None:
        """Tell the other ranks to leave their loop (after a last checkpoint together when save)."""
        if self.world > 1:
            self._send(Command(STOP_AND_SAVE if save else STOP))

    # --- ranks > 0 ----------------------------------------------------------------------------

    def receive(self, engine) -> Command:
        """Wait for rank 0's next command; on STEP, take part in the step and return it."""
        header = self._broadcast(torch.zeros(6, dtype=torch.int64, device=self.device)).tolist()
        cmd = Command(header[0], tuple(header[1:5]), header[5])  # type: ignore[arg-type]
        if cmd.kind != STEP:
            return cmd
        batch = Batch.empty(*cmd.shape, device=self.device)
        for t in batch.tensors():
            self._broadcast(t)
        adv = self._broadcast(torch.empty(cmd.shape[2:], device=self.device))
        out, _ = self._local_step(engine, batch, adv, cmd.version)
        self._gather(out)
        return cmd

    # --- both ---------------------------------------------------------------------------------

    def _local_step(self, engine, batch: Batch, adv: torch.Tensor, version: int | None):
        k = batch.rewards.shape[0] // self.world
        g0 = self.rank * k
        return engine.train_step(batch.groups(g0, g0 + k), adv[g0:g0 + k], token_count=batch.num_tokens / self.world,
                                 sequence_count=batch.input_ids.shape[0] / self.world, version=version)

    def _gather(self, out: LossOutput) -> LossOutput:
        """Every rank's (B/world, T) outputs, concatenated in rank order (= batch order)."""
        import torch.distributed as dist

        def cat(t: torch.Tensor) -> torch.Tensor:
            t = t.contiguous().to(self.device)
            parts = [torch.empty_like(t) for _ in range(self.world)]
            dist.all_gather(parts, t)
            return torch.cat(parts)

        # Each rank's token losses are scaled by world / its share (see Engine.train_step): undo it.
        token_loss = cat(out.token_loss) / self.world
        return LossOutput(loss=token_loss.sum(), token_loss=token_loss, ratio=cat(out.ratio),
                          clipped=cat(out.clipped.to(torch.uint8)).bool(),
                          truncated=cat(out.truncated.to(torch.uint8)).bool(),
                          masked=cat(out.masked.to(torch.uint8)).bool(), weights=cat(out.weights))

    def _send(self, cmd: Command) -> None:
        self._broadcast(torch.tensor([cmd.kind, *cmd.shape, cmd.version], dtype=torch.int64, device=self.device))

    def _broadcast(self, t: torch.Tensor) -> torch.Tensor:
        """Rank 0's `t` into every rank's `t` (which must live on self.device), returned."""
        import torch.distributed as dist

        if t.device.type != self.device.type:  # NCCL would fail later with a far less clear message
            raise ValueError(f"a {t.device} tensor in a collective whose tensors live on {self.device}")
        dist.broadcast(t, src=0)
        return t
