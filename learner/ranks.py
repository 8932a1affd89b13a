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

from learner.batch import Batch
from streamrl.losses import LossOutput

STOP, STEP, STOP_AND_SAVE = 0, 1, 2
_BATCH_FIELDS = ("input_ids", "attention_mask", "completion_mask", "behaviour_logprobs", "rewards",
                 "policy_versions", "last_versions", "layers", "corrections")


class Command(msgspec.Struct, frozen=True):
    kind: int
    shape: tuple[int, int, int, int] = (0, 0, 0, 0)
    """Batch rows B, sequence length L, groups, group size G."""


class Ranks:
    def __init__(self, world: int, rank: int):
        self.world, self.rank = world, rank

    @classmethod
    def current(cls) -> "Ranks":
        import torch.distributed as dist

        if dist.is_initialized():
            return cls(dist.get_world_size(), dist.get_rank())
        return cls(1, 0)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    # --- rank 0 -------------------------------------------------------------------------------

    def train_step(self, engine, batch: Batch, adv: torch.Tensor) -> tuple[LossOutput, dict]:
        """engine.train_step on the whole batch, spread over the ranks; outputs cover the whole batch."""
        if self.world == 1:
            return engine.train_step(batch, adv)
        self._send(Command(STEP, (*batch.input_ids.shape, *batch.rewards.shape)))
        for name in _BATCH_FIELDS:
            self._broadcast(getattr(batch, name))
        self._broadcast(adv.contiguous())
        out, train = self._local_step(engine, batch, adv)
        full = self._gather(out)
        return full, {**train, "loss": float(full.loss)}

    def stop(self, save: bool) -> None:
        """Tell the other ranks to leave their loop (after a last checkpoint together when save)."""
        if self.world > 1:
            self._send(Command(STOP_AND_SAVE if save else STOP))

    # --- ranks > 0 ----------------------------------------------------------------------------

    def receive(self, engine) -> Command:
        """Wait for rank 0's next command; on STEP, take part in the step and return it."""
        header = torch.zeros(5, dtype=torch.int64)
        self._broadcast(header)
        cmd = Command(int(header[0]), tuple(int(x) for x in header[1:]))  # type: ignore[arg-type]
        if cmd.kind != STEP:
            return cmd
        B, L, groups, G = cmd.shape
        shapes = {"input_ids": ((B, L), torch.int64), "attention_mask": ((B, L), torch.int64),
                  "completion_mask": ((B, L - 1), torch.float32), "behaviour_logprobs": ((B, L - 1), torch.float32),
                  "rewards": ((groups, G), torch.float32), "policy_versions": ((groups,), torch.int64),
                  "last_versions": ((groups, G), torch.int64), "layers": ((groups,), torch.int64),
                  "corrections": ((groups, G), torch.float32)}
        fields = {}
        for name in _BATCH_FIELDS:
            fields[name] = torch.empty(*shapes[name][0], dtype=shapes[name][1])
            self._broadcast(fields[name])
        adv = torch.empty(groups, G)
        self._broadcast(adv)
        out, _ = self._local_step(engine, Batch(**fields), adv)
        self._gather(out)
        return cmd

    # --- both ---------------------------------------------------------------------------------

    def _local_step(self, engine, batch: Batch, adv: torch.Tensor):
        groups = batch.rewards.shape[0]
        k, G = groups // self.world, batch.rewards.shape[1]
        g0, r0 = self.rank * k, self.rank * k * G
        rows = slice(r0, r0 + k * G)
        share = Batch(input_ids=batch.input_ids[rows], attention_mask=batch.attention_mask[rows],
                      completion_mask=batch.completion_mask[rows], behaviour_logprobs=batch.behaviour_logprobs[rows],
                      rewards=batch.rewards[g0:g0 + k], policy_versions=batch.policy_versions[g0:g0 + k],
                      last_versions=batch.last_versions[g0:g0 + k], layers=batch.layers[g0:g0 + k],
                      corrections=batch.corrections[g0:g0 + k])
        return engine.train_step(share, adv[g0:g0 + k], token_count=batch.num_tokens / self.world)

    def _gather(self, out: LossOutput) -> LossOutput:
        """Every rank's (B/world, T) outputs, concatenated in rank order (= batch order)."""
        import torch.distributed as dist

        def cat(t: torch.Tensor) -> torch.Tensor:
            parts = [torch.empty_like(t) for _ in range(self.world)]
            dist.all_gather(parts, t.contiguous())
            return torch.cat(parts)

        # Each rank's token losses are scaled by world / its share (see Engine.train_step): undo it.
        token_loss = cat(out.token_loss) / self.world
        return LossOutput(loss=token_loss.sum(), token_loss=token_loss, ratio=cat(out.ratio),
                          clipped=cat(out.clipped.to(torch.uint8)).bool())

    def _send(self, cmd: Command) -> None:
        self._broadcast(torch.tensor([cmd.kind, *cmd.shape], dtype=torch.int64))

    @staticmethod
    def _broadcast(t: torch.Tensor) -> None:
        import torch.distributed as dist

        dist.broadcast(t, src=0)
