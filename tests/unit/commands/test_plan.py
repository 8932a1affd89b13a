"""`streamrl plan`: model-state figures agree with DeepSpeed's own estimators and parameter counting,
the shape comes from config.json alone, and a config that does not fit is said plainly."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrl import config
from streamrl.commands import cli, plan

REPO = Path(__file__).resolve().parents[3]
QWEN3_8B = REPO / "configs" / "models" / "Qwen3-8B" / "config.json"
PAPER = str(REPO / "configs" / "paper" / "corpo.yaml")


def test_qwen3_8b_is_planned_from_its_config_json_without_weights():
    s = plan.shape(config.load(PAPER))
    assert s.source == str(QWEN3_8B)  # model.path models/Qwen3-8B is not here: the shipped copy is used
    h, layers, q, kv, inter, vocab = 4096, 36, 32 * 128, 8 * 128, 12288, 151_936
    per_layer = 2 * h * q + 2 * h * kv + 3 * h * inter + 2 * h + 2 * 128  # attention, MLP, 2 norms, q/k norms
    assert s.params == 2 * vocab * h + layers * per_layer + h == 8_190_735_360  # untied: embedding + output layer
    assert s.largest_layer_params == vocab * h
    assert (s.layers, s.heads, s.kv_heads, s.head_dim, s.intermediate) == (36, 32, 8, 128, 12288)


def test_parameter_counts_match_deepspeeds_model_to_params_on_real_weights(release_model):
    from deepspeed.runtime.zero.stage3 import model_to_params
    from transformers import AutoModelForCausalLM

    s = plan.shape(config.load(None, [f"model.path={release_model}"]))
    model = AutoModelForCausalLM.from_pretrained(release_model, local_files_only=True)
    assert (s.params, s.largest_layer_params) == model_to_params(model)


@pytest.mark.parametrize("ranks", [1, 2, 8])
def test_16bit_model_states_are_deepspeeds_estimates(ranks):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    P, L = 8_190_735_360, 622_329_856
    z2 = estimate_zero2_model_states_mem_needs(P, num_gpus_per_node=ranks, cpu_offload=False)[1]
    z3 = estimate_zero3_model_states_mem_needs(P, L, num_gpus_per_node=ranks, cpu_offload=False)[1]
    for stage in (1, 2):
        assert plan.model_states_bytes(P, L, stage, ranks, "bfloat16") == z2 == 2 * P + int(18 * P / ranks)
    assert plan.model_states_bytes(P, L, 3, ranks, "bfloat16") == z3 == 4 * L + int(18 * P / ranks)
    # stage 0 shards nothing: one rank's figure whatever the rank count
    assert plan.model_states_bytes(P, L, 0, ranks, "bfloat16") == 20 * P
    # fp32 (no estimator in DeepSpeed): 4 B weights + 4 B grads + 8 B Adam, sharded as the stage says
    assert plan.model_states_bytes(P, L, 0, ranks, "float32") == 16 * P
    assert plan.model_states_bytes(P, L, 2, ranks, "float32") == 4 * P + 12 * P // ranks


def test_activation_checkpointing_and_chunking_shrink_the_learners_need():
    cfg = config.load(PAPER, ["model.max_seq_len=16384"])
    s = plan.shape(cfg)
    full, ckpt = (plan.activation_bytes_per_token(s, "bfloat16", c) for c in (False, True))
    assert ckpt < full / 10  # 36 layer inputs + one layer, against 36 layers' saved tensors
    assert plan.logprob_chunk_bytes(s, "bfloat16", 1024) == 1024 * 151_936 * 14
    assert plan.kv_bytes_per_token(s, "bfloat16") == 2 * 36 * 8 * 128 * 2


def _plan(capsys, *args) -> tuple[int, str]:
    rc = cli.main(["plan", *args])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_the_paper_config_as_shipped_does_not_fit_8_gpus_and_the_plan_says_why(capsys):
    rc, out = _plan(capsys, PAPER, "--gpus", "8", "--gpu-mem", "80")
    assert rc == 1 and "verdict: DOES NOT FIT (8 GPUs, 80 GB each)" in out
    assert "9 GPUs needed (1 learner + 8 actor), 8 given" in out and "the learner needs" in out


def test_a_missing_model_config_is_one_line(capsys, tmp_path):
    rc, out = _plan(capsys, f"model.path={tmp_path / 'nowhere' / 'Unknown-1B'}")
    assert rc == 2 and out.count("\n") == 1 and "no config.json there" in out


def test_run_warns_when_the_processes_need_more_than_this_machines_memory(release_model):
    cfg = config.load(None, [f"model.path={release_model}", "learner.batch_groups=4096", "model.max_seq_len=4096"])
    warning = plan.run_warning(cfg)
    assert warning and "more than this machine's" in warning
    assert plan.run_warning(config.load(None, ["learner.batch_groups=4096"])) is None  # the tiny model is not planned
    assert plan.run_warning(config.load(None, [f"model.path={release_model}"])) is None  # the default batch fits


def test_an_engines_gpu_memory_share_is_what_the_plan_fits_its_weights_and_kv_into():
    cfg = config.load(PAPER, ["actors.gpu_memory_fraction=0.1"])
    s = plan.shape(cfg)
    part = plan.actor_part(cfg, s, 4096, 80.0)  # 8 B parameters in bf16 (16 GB) in 8 GB of an 80 GB GPU
    assert part.fits is False and any("8.0 GB of the GPU's 80 (actors.gpu_memory_fraction=0.1)" in x for x in part.lines)
    assert plan.actor_part(config.load(PAPER), s, 4096, 80.0).fits is True


def test_lora_adapters_are_counted_by_peft_on_the_meta_model_and_match_the_formula():
    s = plan.shape(config.load(PAPER, ["lora.rank=16"]))
    h, layers, q, kv, inter, r = 4096, 36, 32 * 128, 8 * 128, 12288, 16
    # r x (in + out) per adapted projection: q, k, v, o and gate, up, down
    per_layer = r * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + inter) + (inter + h))
    assert s.adapter_params == layers * per_layer == 43_646_976
    assert s.params == 8_190_735_360  # the base, as without LoRA


def test_lora_shrinks_the_learners_model_states_to_a_frozen_base_plus_fp32_adapters(capsys):
    P, L, A = 8_190_735_360, 622_329_856, 43_646_976
    base, adapters = plan.lora_model_states_bytes(P, L, A, 0, 1, "bfloat16")
    assert (base, adapters) == (2 * P, 16 * A)
    base, adapters = plan.lora_model_states_bytes(P, L, A, 3, 8, "bfloat16")
    assert (base, adapters) == (2 * L + 2 * P // 8, 4 * 4 * 0 + 16 * A // 8)
    rc, out = _plan(capsys, PAPER, "lora.rank=16", "learner.micro_batch_tokens=16384",
                    "learner.activation_checkpointing=true")
    assert "LoRA rank 16: frozen base 17.63 GB (bfloat16, no gradients or Adam state) + 43.65 M adapter" in out
    assert "full fine-tuning: 149.92 GB" in out and "8.2x smaller" in out
    assert "publish          174.6 MB per version (the fp32 adapters), against 16,381.5 MB of full weights" in out
