"""A LoRA run of the tiny job end to end (a learner and two hf actors on loopback): every version is the adapters
only, the checkpoints hold the adapters (a PEFT folder naming the base) and no base, and a resumed run goes on
from them; strict mode's self-check holds at lag 0 with LoRA."""

from __future__ import annotations

import json

import pytest
from procs import metrics, summary
from safetensors.torch import load_file

from streamrl import config
from streamrl.models import lora, model

pytestmark = pytest.mark.slow


@pytest.mark.long
def test_a_lora_run_publishes_only_adapters_checkpoints_them_and_resumes(run_job):
    run = run_job("lora.rank=8", "optim.lr=3e-3", "steps=12", "learner.checkpoint_every=6", name="lora")
    s = summary(run)
    assert s["status"] == "finished" and s["steps"] == 12
    m, _ = model.build(config.load(None, ["lora.rank=8"]))
    adapters = lora.published(m.state_dict())
    adapter_bytes = sum(t.numel() * t.element_size() for t in adapters.values())
    full_bytes = sum(t.numel() * t.element_size() for t in m.state_dict().values())
    assert s["publish_bytes_per_version"] < adapter_bytes * 1.05 < full_bytes / 4  # the adapters, framed
    tag = run / "checkpoints" / "step-6"
    state = json.loads((tag / "streamrl.json").read_text())
    assert state["lora"]["rank"] == 8 and state["lora"]["base"].startswith("streamrl-tiny(seed=0")
    saved, adapter_cfg = lora.read_adapter_folder(tag / "adapter")
    assert set(saved) == set(adapters) and adapter_cfg["base_model_name_or_path"] == state["lora"]["base"]
    policy = load_file(str(tag / "policy.safetensors"))  # the whole adapted model, for streamrl eval
    assert all(policy[k].equal(saved[k]) for k in saved)
    assert any(policy[k].abs().max() > 0 for k in saved if ".lora_B." in k)  # trained
    ds_files = sum(f.stat().st_size for f in tag.glob("*.pt"))
    assert ds_files < full_bytes  # DeepSpeed's files hold adapters and their Adam state, not the base
    run = run_job("lora.rank=8", "optim.lr=3e-3", "steps=18", "learner.resume=true", name="lora")
    recs = metrics(run)
    assert recs[-1]["step"] == 17 and summary(run)["status"] == "finished"
    assert "resumed from" in (run / "logs" / "learner.log").read_text()


@pytest.mark.long
def test_the_strict_self_check_holds_at_lag_0_with_lora(run_job):
    run = run_job("lora.rank=8", "optim.lr=3e-3", "on_policy=strict", "steps=6", name="lora-strict")
    recs = metrics(run)
    assert len(recs) == 6 and all(r["lag_max"] == 0 for r in recs)
    assert max(r["is_ratio_max_abs_dev"] for r in recs) < 1e-4  # strict mode stopped the run otherwise


@pytest.mark.long
def test_the_tiny_lora_recipe_learns_the_default_task(run_job):
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[2] / "configs" / "tiny-lora.yaml"
    cfg = config.load(recipe)
    targets = ",".join(cfg.lora.target_modules)
    run = run_job(f"lora.rank={cfg.lora.rank}", f"optim.lr={cfg.optim.lr}", f"lora.target_modules=[{targets}]",
                  name="tiny-lora", timeout=600)
    s = summary(run)
    # as the default job's test asks of full fine-tuning: the last 10% beat the first by 20% of the range
    assert s["improvement_fraction_of_range"] >= 0.2, s
    assert s["publish_bytes_per_version"] < 100_000  # 72 KB of adapters (and framing), not the 408 KB model


@pytest.mark.long
def test_a_strict_lora_run_over_the_collective_broadcasts_the_adapters(run_job):
    run = run_job("lora.rank=8", "optim.lr=1e-3", "on_policy=strict", "transport.weight_sync=collective", "steps=8",
                  name="lora-collective")
    recs = metrics(run)
    assert len(recs) == 8 and max(r["is_ratio_max_abs_dev"] for r in recs) < 1e-4
    sync = summary(run)["weight_sync"]
    assert sync["failed"] is None and sync["syncs"] >= 1  # versions went over the group, formed over the adapters
