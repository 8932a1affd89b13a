"""Start-up: the phase records, what each process imports, that nothing compiles on the way to the
first step, and the forked children of `streamrl run` (the whole path: `streamrl bench startup`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamrl.bench import startup as bench_startup
from streamrl.telemetry import startup

REPO = Path(__file__).resolve().parents[3]
TINY = str(REPO / "configs" / "tiny.yaml")


def _python(code: str, tmp_path: Path, **env) -> dict:
    """Run `code` in a fresh interpreter; it prints one JSON object last."""
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO), **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_phases_are_written_once_and_read_back_with_durations_that_add_up(tmp_path, monkeypatch):
    monkeypatch.setenv(startup.SPAWNED_AT, "100.0")
    p = startup.Phases("actor-0")
    assert p.marks["start"] == 100.0  # the clock starts at the spawn, not at the first mark
    p.marks.update(imports=101.5, model=102.0, ready=102.25)
    p.mark("ready")  # the first mark of a name counts
    assert p.marks["ready"] == 102.25
    p.done(tmp_path)
    p.marks["first_group"] = 200.0
    p.done(tmp_path)  # once only
    rec = startup.read(tmp_path)["actor-0"]
    assert rec["durations"] == {"imports": 1.5, "model": 0.5, "ready": 0.25, "total": 2.25}


def test_the_bench_phases_partition_the_time_to_the_first_step():
    records = {"run": {"marks": {"start": 0.0, "configured": 0.3, "imports": 3.0}},
               "learner": {"marks": {"start": 3.1, "imports": 3.2, "model": 3.3, "engine": 3.9, "ready": 4.0,
                                     "first_group": 4.5, "first_step": 4.7}}}
    got = bench_startup.phases(records)
    assert got["preload"] == pytest.approx(2.7) and got["engine"] == pytest.approx(0.6)
    assert sum(got[p] for p in bench_startup.PHASES) == pytest.approx(got["total"]) == 4.7
    records["run"]["cpu"] = {"start": 0.0, "configured": 0.2, "imports": 2.5, "spawned": 2.6}
    records["learner"]["cpu"] = {"start": 0.0, "first_step": 1.0}
    records["actor-0"] = {"marks": {}, "cpu": {"start": 0.0, "first_group": 0.5}}
    got = bench_startup.phases(records)
    assert got["critical_cpu"] == pytest.approx(3.5) and got["all_cpu"] == pytest.approx(4.1)


def test_the_launcher_imports_neither_torch_nor_transformers_on_a_machine_without_gpus(tmp_path):
    got = _python(f"""
import json, sys
from streamrl.commands import cli, launch
code = cli.main(["check", {TINY!r}, "run_dir={tmp_path}"])
gpus = launch.gpu_devices_present()
if not gpus:
    assert launch.visible_gpus() == []
print(json.dumps({{"code": code, "gpus": gpus, "heavy": [m for m in ("torch", "transformers", "deepspeed") if m in sys.modules]}}))
""", tmp_path)
    assert got["code"] == 0
    if not got["gpus"]:
        assert got["heavy"] == []


def test_an_actor_never_imports_deepspeed_nor_transformers_modeling_code(tmp_path):
    """An actor's whole start-up (entry, model, backend, a generate call) and the launcher's preload leave out
    DeepSpeed, and for the tiny default transformers altogether and torch._dynamo."""
    got = _python(f"""
import json, sys
import streamrl.actors.main
from streamrl.actors import backends
from streamrl import config
from streamrl.models import model
from streamrl.tasks import rewards
from streamrl.commands import forked
cfg = config.load({TINY!r}, [])
forked.preload(cfg)
reward = rewards.build(cfg)
m, tok = model.build(cfg, reward.task.vocabulary)
b = backends.build("hf", cfg, m, tok, 0)
b.generate([[3, 4]], 2)
print(json.dumps({{m: m in sys.modules for m in ("deepspeed", "torch", "transformers", "torch._dynamo",
                                                 "datasets", "pyarrow")}}))
""", tmp_path)
    # datasets and pyarrow: only tasks that read data import them (streamrl.tasks.data)
    assert got == {"deepspeed": False, "torch": True, "transformers": False, "torch._dynamo": False,
                   "datasets": False, "pyarrow": False}


def test_the_learner_engine_builds_and_steps_without_compiling_probing_or_heavy_imports(tmp_path):
    """DeepSpeed would build (or load) its shm comm op and probe every op's compiler at init; torch's
    optimizer would import torch._dynamo (1.8 s), transformers' Llama its modeling code (3.4 s), and
    transformers' tokenizer transformers itself (0.8 s)."""
    ext = tmp_path / "torch_extensions"
    got = _python(f"""
import json, sys
import deepspeed.ops
import torch
from streamrl.algo import advantages
from streamrl import config
from streamrl.models import model
from streamrl.comm.codec import ScoredGroup
from streamrl.learner.batch import collate
from streamrl.learner.engine import Engine
cfg = config.load({TINY!r}, [])
m, tok = model.build(cfg)
e = Engine(cfg, m)
g = ScoredGroup.from_samples(prompt_id="p", policy_version=0, actor_id="a", prompt_tokens=[3, 4, 5],
                             completions=[[6, 1], [7, 8, 1]], logprobs=[[-1.0, -1.0], [-1.0, -1.0, -1.0]],
                             rewards=[0.0, 1.0], finish_reasons=["stop", "stop"])
batch = collate([g], tok.pad_token_id)
before = {{k: v.clone() for k, v in e.full_state_dict().items()}}
e.train_step(batch, advantages.compute(batch.rewards, "grpo", 0.75))
moved = any(not torch.equal(before[k], v) for k, v in e.full_state_dict().items())
print(json.dumps({{"compatible_ops": vars(deepspeed.ops)["__compatible_ops__"], "moved": moved,
                  "heavy": [m for m in ("torch._dynamo", "transformers", "sympy") if m in sys.modules]}}))
e.close()
""", tmp_path, TORCH_EXTENSIONS_DIR=str(ext))
    assert got["compatible_ops"] == {"deepspeed_shm_comm": False}  # never probed
    assert not ext.exists() or not any(ext.rglob("*.so"))
    assert got["moved"] and got["heavy"] == []


def test_a_forked_child_runs_its_command_in_its_own_session_with_its_own_log_and_status(tmp_path):
    got = _python(f"""
import json, os
from streamrl.commands import forked
log = {str(tmp_path / "child.log")!r}
ok = forked.spawn(["check", {TINY!r}, "run_dir={tmp_path}"], log, dict(os.environ), lambda: None)
bad = forked.spawn(["check", {TINY!r}, "advantage.estimator=nope"], log + ".bad", dict(os.environ), lambda: None)
print(json.dumps({{"ok": ok.wait(60), "bad": bad.wait(60), "parent_sid": os.getsid(0)}}))
""", tmp_path)
    assert got["ok"] == 0 and got["bad"] == 2
    assert "name: tiny" in (tmp_path / "child.log").read_text()
    assert "advantage.estimator='nope'" in (tmp_path / "child.log.bad").read_text()


def test_a_forked_child_shows_its_own_command_line(tmp_path):
    if not Path("/proc/self/stat").exists():
        pytest.skip("needs /proc")
    got = _python("""
import json
from streamrl.commands.forked import set_cmdline
pad = "x" * 200  # the command line this interpreter started with, long enough to take the new one
set_cmdline(["streamrl", "actor", "runs/tiny/config.yaml", "--index", "1"])
print(json.dumps({"cmdline": open("/proc/self/cmdline", "rb").read().decode()}))
""", tmp_path)
    assert got["cmdline"].rstrip("\0").split("\0") == ["streamrl", "actor", "runs/tiny/config.yaml", "--index", "1"]
