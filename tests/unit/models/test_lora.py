"""LoRA through peft on the tiny plain-torch Llama and a transformers Qwen3: what is trained, what travels,
what a merged or PEFT-folder export holds, and the errors a wrong setting gets."""

from __future__ import annotations

import pytest
import torch

from streamrl import config
from streamrl.models import lora, model


def _build(*overrides: str):
    cfg = config.load(None, ["lora.rank=4", *overrides])
    return (*model.build(cfg), cfg)


def _nudge(m) -> None:
    """Give every adapter non-zero weights (lora_B starts at zero: the adapted model equals the base)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if lora.is_adapter(n):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def test_only_the_adapters_train_in_fp32_on_a_frozen_base_of_the_configured_dtype():
    m, _, cfg = _build("model.dtype=bfloat16")
    trainable = {n: p for n, p in m.named_parameters() if p.requires_grad}
    assert trainable and all(lora.is_adapter(n) and p.dtype == torch.float32 for n, p in trainable.items())
    frozen = [p for n, p in m.named_parameters() if not p.requires_grad]
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    # r x (in + out) on q, k, v, o (64 -> 64) and gate, up (64 -> 128), down (128 -> 64), in 2 layers
    assert lora.count(m)[0] == 2 * 4 * (4 * 128 + 3 * 192)


def test_the_adapters_start_as_the_base_and_the_same_seed_gives_the_same_adapters():
    a, _, _ = _build()
    b, _, _ = _build()
    plain, _ = model.build(config.load(None, []))
    ids = torch.tensor([[2, 5, 6, 7, 8]])
    assert torch.equal(a(ids).logits, plain(ids).logits)  # lora_B = 0
    sa, sb = lora.published(a.state_dict()), lora.published(b.state_dict())
    assert sorted(sa) == sorted(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_version_carries_only_the_adapters_and_the_hf_backend_applies_them():
    from streamrl.actors.backends.hf import HFBackend

    learner, tok, cfg = _build()
    _nudge(learner)
    actor, _, _ = _build()
    backend = HFBackend(cfg, actor, tok)
    version = lora.published(learner.state_dict())
    assert version and all(lora.is_adapter(k) for k in version)
    backend.load_weights({k: v.clone() for k, v in version.items()})
    ids = torch.tensor([[2, 5, 6, 7, 8]])
    assert torch.equal(backend.model(ids).logits, learner(ids).logits)
    with pytest.raises(ValueError, match="differ from the model's adapters"):
        backend.load_weights(learner.state_dict())  # full weights are not a LoRA version


def test_merged_weights_give_the_adapted_models_logits_on_the_plain_model():
    m, _, cfg = _build()
    _nudge(m)
    plain, _ = model.build(config.load(None, []))
    plain.load_state_dict(lora.merged(m.state_dict(), cfg.lora), strict=True)
    ids = torch.tensor([[2, 5, 6, 7, 8, 9]])
    assert torch.allclose(plain(ids).logits, m(ids).logits, atol=1e-5)


def test_a_target_module_the_model_lacks_is_a_clear_error():
    with pytest.raises(ValueError, match=r"lora.target_modules=\['qkv'\].*linear modules are \[.*'q_proj'"):
        _build("lora.target_modules=[qkv]")


def test_an_empty_target_list_is_refused_by_the_config():
    with pytest.raises(config.ConfigError, match="target_modules"):
        config.load(None, ["lora.rank=4", "lora.target_modules=[]"])


def test_resume_refuses_a_checkpoint_of_the_other_kind():
    from types import SimpleNamespace

    from streamrl.learner.checkpoints import _lora_mismatch

    cfg = config.load(None, ["lora.rank=8"])
    with_lora = SimpleNamespace(lora=True, cfg=cfg)
    without = SimpleNamespace(lora=False, cfg=config.load(None, []))
    assert "full fine-tuning checkpoint" in _lora_mismatch(with_lora, {"step": 3})
    assert "a LoRA checkpoint (rank 8" in _lora_mismatch(without, {"lora": {"rank": 8, "base": "x"}})
    assert "LoRA rank 4" in _lora_mismatch(with_lora, {"lora": {"rank": 4}})
    assert _lora_mismatch(with_lora, {"lora": {"rank": 8}}) is None and _lora_mismatch(without, {}) is None


def test_a_peft_adapter_folder_loads_in_peft_beside_the_release_shaped_base(release_model, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    m, _, cfg = _build(f"model.path={release_model}")
    _nudge(m)
    folder = lora.write_adapter_folder(tmp_path / "adapter", lora.published(m.state_dict()), cfg.lora, release_model)
    read, adapter_cfg = lora.read_adapter_folder(folder)
    assert adapter_cfg["base_model_name_or_path"] == release_model and adapter_cfg["r"] == 4
    base = AutoModelForCausalLM.from_pretrained(release_model, local_files_only=True)
    peft_model = PeftModel.from_pretrained(base, str(folder)).eval()
    ids = torch.tensor([[11, 12, 13, 14]])
    with torch.no_grad():
        assert torch.allclose(peft_model(ids).logits, m.eval()(ids).logits, atol=1e-5)
    merged = AutoModelForCausalLM.from_pretrained(release_model, local_files_only=True)
    merged.load_state_dict(lora.merged(m.state_dict(), cfg.lora), strict=True)
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, m(ids).logits, atol=1e-5)


def test_export_gives_merged_base_weights_or_a_peft_folder_from_a_checkpoint(tmp_path):
    from streamrl.learner.checkpoints import write_policy

    m, _, cfg = _build()
    _nudge(m)
    tag = tmp_path / "step-3"
    tag.mkdir()
    write_policy(tag / "policy.safetensors", m.state_dict())
    plain, _ = model.build(config.load(None, []))
    plain.load_state_dict(lora.export(tag, cfg, merge=True), strict=True)
    ids = torch.tensor([[2, 5, 6, 7]])
    assert torch.allclose(plain(ids).logits, m(ids).logits, atol=1e-5)
    folder = lora.export(tag, cfg, tmp_path / "adapter")
    read, adapter_cfg = lora.read_adapter_folder(folder)
    assert adapter_cfg["base_model_name_or_path"] == lora.base_name(cfg)
    assert all(torch.equal(read[k], v) for k, v in lora.published(m.state_dict()).items())
    write_policy(tag / "policy.safetensors", plain.state_dict())
    with pytest.raises(ValueError, match="not a LoRA checkpoint"):
        lora.export(tag, cfg, merge=True)
