"""What the engine GPU tests compare an engine's log-probs with: the learner's teacher-forced
recomputation (streamrl.models.sampling) under given weights, full or cut to the top-p nucleus."""

from __future__ import annotations

import torch

PROMPTS = ("copy : a b c d =", "copy : d c b a =")


def prompts(tok) -> list[list[int]]:
    return [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]


def gap(m, tok, prompts: list[list[int]], groups, temperature: float) -> float:
    """Largest |engine's summed log-prob - the learner's recomputation at `temperature`| over the samples."""
    from streamrl.models import sampling

    flat = [(p, c) for p, g in zip(prompts, groups) for c in g]
    ref = sampling.sequence_logprobs(m, [p for p, _ in flat], [c.tokens for _, c in flat], tok.pad_token_id,
                                     temperature=temperature)
    return max(abs(r - sum(c.logprobs)) for r, (_, c) in zip(ref, flat))


def nucleus_gap(m, prompts: list[list[int]], groups, temperature: float, top_p: float) -> float:
    """As gap, against the tempered distribution cut to its top-p nucleus and renormalised (drop the
    smallest tokens whose cumulative mass stays within 1 - top_p, keep at least one)."""
    worst = 0.0
    for p, g in zip(prompts, groups):
        for c in g:
            with torch.no_grad():
                logits = m(torch.tensor([p + c.tokens])).logits[0, len(p) - 1:-1].float() / temperature
            probs, order = logits.softmax(-1).sort(-1)
            drop = probs.cumsum(-1) <= 1 - top_p
            drop[:, -1] = False
            cut = logits.scatter(-1, order, logits.gather(-1, order).masked_fill(drop, float("-inf")))
            ref = float(cut.log_softmax(-1).gather(-1, torch.tensor(c.tokens)[:, None]).sum())
            worst = max(worst, abs(ref - sum(c.logprobs)))
    return worst


def _export(state: dict, conn) -> None:
    """The learner's end in a process of its own (a process cannot open its own CUDA IPC handle): exports `state`,
    sends the manifest's bytes, holds the buffer until told to go."""
    from streamrl.comm import wire
    from streamrl.comm.weights.ipc import CudaIpc, IpcExporter

    exporter = IpcExporter(CudaIpc(), actors=1)
    msg = exporter.announcement(1, {k: v.cuda() for k, v in state.items()}, "learner")
    conn.send_bytes(wire.encode(msg))
    conn.recv_bytes()
    exporter.close()


class Exported:
    """`state` exported over CUDA IPC by another process, as the learner does: `.msg` is its WeightsIpc manifest."""

    def __init__(self, state: dict):
        import torch.multiprocessing as mp

        from streamrl.comm import wire

        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_export, args=({k: v.cpu() for k, v in state.items()}, child))
        self.proc.start()
        self.msg = wire.decode_header(self.conn.recv_bytes())

    def close(self) -> None:
        self.conn.send_bytes(b"go")
        self.proc.join(60)


def load_over_ipc(backend, m, new: dict) -> dict:
    """`new` exported by another process, as the learner does, and loaded through the actor's IPC receiver into
    `backend` (its `receive_weight_ipc`); returns the receiver's report. Fails if the version was refused."""
    from streamrl.comm.weights.ipc import CudaIpc, IpcReceiver

    exported = Exported(new)
    try:
        acks: list = []
        receiver = IpcReceiver(CudaIpc(), "actor-0", m.state_dict(), torch.device("cpu"), acks.append,
                               into=backend.receive_weight_ipc)
        assert receiver.receive(exported.msg) is not None and acks[0].ok, acks
        return receiver.report()
    finally:
        exported.close()
