"""learner.optimizer.AdamW: torch's AdamW step for step, without importing torch._dynamo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from streamrl.learner.optimizer import AdamW

REPO = Path(__file__).resolve().parents[3]


def _train(cls, steps: int = 5) -> tuple[list[torch.Tensor], dict]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    opt = cls(net.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))  # the engine schedules it so
    for step in range(steps):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(step))
        net(x).square().mean().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        assert all(p.grad is None for p in net.parameters())
    return [p.detach().clone() for p in net.parameters()], opt.state_dict()


def test_steps_and_state_equal_torchs_adamw_bit_for_bit():
    mine, mine_state = _train(AdamW)
    theirs, their_state = _train(torch.optim.AdamW)
    assert all(torch.equal(a, b) for a, b in zip(mine, theirs))
    assert mine_state["param_groups"] == their_state["param_groups"]
    for i, s in their_state["state"].items():
        assert all(torch.equal(mine_state["state"][i][k], v) for k, v in s.items())
    # a checkpoint of one loads into the other
    resumed = torch.optim.AdamW([torch.nn.Parameter(p.clone()) for p in theirs], lr=1.0)
    resumed.load_state_dict(mine_state)
    assert resumed.state_dict()["param_groups"][0]["lr"] == mine_state["param_groups"][0]["lr"]


def test_its_calls_leave_torch_dynamo_unimported():
    code = """
import json, sys, torch
from streamrl.learner.optimizer import AdamW
p = torch.nn.Parameter(torch.ones(3))
opt = AdamW([p], lr=0.1, weight_decay=0.01)
p.sum().backward()
opt.step(); opt.zero_grad(); opt.load_state_dict(opt.state_dict())
print(json.dumps({"dynamo": "torch._dynamo" in sys.modules, "moved": bool((p != 1).all())}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"dynamo": False, "moved": True}
