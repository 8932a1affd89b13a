"""`streamrl plan CONFIG`: the per-GPU memory a config needs, before anything starts.

The model's shape comes from its config.json alone (no weights): the folder `model.path` names, the
Hugging Face cache for a hub id, or a shipped copy (`configs/models/<name>/config.json`, e.g.
Qwen3-8B) when the model is not on this machine. Parameters are counted exactly by building the
architecture on PyTorch's meta device.

Learner, per GPU (one rank per GPU, `learner.ranks` of them):
  - model states: parameters, gradients and Adam state under the ZeRO stage. In 16-bit training
    these are DeepSpeed's own estimators with nothing offloaded
    (`estimate_zero2_model_states_mem_needs` for stages 0-2, stage 0 as one rank;
    `estimate_zero3_model_states_mem_needs` for stage 3): 2 B/param of 16-bit weights on every
    rank (stage 3: 4 B/param of the largest layer, gathered) + 18 B/param sharded (16-bit and fp32
    gradients, fp32 master weights, two fp32 Adam moments). In fp32 DeepSpeed has no estimator:
    4 B weights + 4 B gradients + 8 B Adam, sharded as the stage says.
  - activations of one micro-batch (`learner.micro_batch_tokens`; 0: the rank's whole share),
    counted per token and layer for a decoder with SDPA/flash attention (no seq² term): without
    checkpointing every saved tensor of every layer; with `learner.activation_checkpointing` each
    layer's input plus one layer's saved tensors during its recomputation.
  - the log-prob chunk (`learner.logprob_chunk_tokens`): that many tokens' full-vocabulary logits,
    in the model's dtype and in fp32, with their gradient.
Actors, per GPU (`actors.num` × `actors.tensor_parallel_size` GPUs): weights plus the KV cache of
`prompts_per_generate × group_size` sequences at full length, both split over the tensor-parallel
GPUs. An engine that cannot hold every sequence's KV at once runs fewer at a time (slower, not
fatal); one that cannot hold a single full-length sequence next to its weights cannot run.

These are estimates of the largest live tensors, not of allocator slack or CUDA context (budget
a few GB per GPU for those); the model-state figures are exact where DeepSpeed's estimators are.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import msgspec

from streamrl import resources
from streamrl.config import Config
from streamrl.commands import options

GB = 1e9
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class Shape(msgspec.Struct, frozen=True):
    """What the plan needs of a model, read from its config.json."""

    name: str
    source: str
    """Where the config came from (a file, or 'built from the config' for the tiny model)."""
    params: int
    largest_layer_params: int
    """Parameters of the largest single module (DeepSpeed's `model_to_params` measure; the embedding here)."""
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    adapter_params: int = 0
    """LoRA (lora.rank > 0): the adapters' parameters, counted by injecting peft's layers into the meta model."""


def _hf_config_path(cfg: Config) -> tuple[Path | None, str]:
    """config.json of the configured model, and its display name."""
    path = cfg.model.path
    name = Path(path).name if path else "tiny"
    if path is None:
        return None, name
    where = Path(path).expanduser()
    if (where / "config.json").is_file():
        return where / "config.json", name
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(path, "config.json")
        if isinstance(cached, str):
            return Path(cached), name
    except Exception:  # not a hub id: fall through to the shipped copies
        pass
    shapes = sorted(resources.model_shapes_dir().glob("*/config.json"))
    for cand in shapes:
        if cand.parent.name.lower() == name.lower():
            return cand, name
    shipped = ", ".join(p.parent.name for p in shapes) or "none"
    raise FileNotFoundError(f"model.path={path!r}: no config.json there, in the Hugging Face cache, or shipped in "
                            f"configs/models/ ({shipped}); give --model-config FILE")


def shape(cfg: Config, model_config: str | Path | None = None) -> Shape:
    """The model's Shape: from `model_config` (a config.json) when given, else as `_hf_config_path` finds it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if model_config is not None:
        path, name = Path(model_config), Path(model_config).parent.name or "model"
    else:
        path, name = _hf_config_path(cfg)
    if path is None:  # the tiny model: its config is made in code, from the task's tokenizer
        from streamrl.models import model as model_lib
        from streamrl.models.tiny_llama import transformers_config

        hf = transformers_config(model_lib.build(cfg)[0].config)
        source = "streamrl.models.model.build (tiny Llama)"
    else:
        raw = json.loads(path.read_text())
        hf = AutoConfig.for_model(raw.pop("model_type"), **raw)
        source = str(path)
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        model = AutoModelForCausalLM.from_config(hf)
        unique = {id(p): p.numel() for p in model.parameters()}  # tied weights count once
        adapters = 0
        if getattr(cfg, "lora", None) is not None and cfg.lora.rank > 0:
            from streamrl.models import lora

            adapters = lora.count(lora.apply(model, cfg.lora))[0]
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    heads = hf.num_attention_heads
    return Shape(name=name, source=source, params=sum(unique.values()), largest_layer_params=largest,
                 adapter_params=adapters,
                 hidden=hf.hidden_size, layers=hf.num_hidden_layers, heads=heads,
                 kv_heads=getattr(hf, "num_key_value_heads", None) or heads,
                 head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // heads,
                 intermediate=hf.intermediate_size, vocab=hf.vocab_size)


def model_states_bytes(params: int, largest_layer_params: int, stage: int, ranks: int, dtype: str) -> int:
    """Parameters, gradients and Adam state per GPU under ZeRO `stage` over `ranks` GPUs (nothing offloaded).
    16-bit: DeepSpeed's estimators' GPU figure (see the module docstring); fp32: 16 B/param, sharded by stage."""
    if dtype in ("bfloat16", "float16"):
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        if stage == 3:
            return estimate_zero3_model_states_mem_needs(params, largest_layer_params, num_gpus_per_node=ranks,
                                                         cpu_offload=False)[1]
        # Stage 0 partitions nothing: as one rank. Stages 1 and 2 share DeepSpeed's one ZeRO optimizer.
        return estimate_zero2_model_states_mem_needs(params, num_gpus_per_node=1 if stage == 0 else ranks,
                                                     cpu_offload=False)[1]
    weights, grads, adam = 4 * params, 4 * params, 8 * params
    if stage == 0:
        return weights + grads + adam
    if stage == 1:
        return weights + grads + adam // ranks
    if stage == 2:
        return weights + (grads + adam) // ranks
    return 4 * 4 * largest_layer_params + (weights + grads + adam) // ranks  # stage 3: a gathered layer + shards


def lora_model_states_bytes(base_params: int, largest_layer_params: int, adapter_params: int, stage: int,
                            ranks: int, dtype: str) -> tuple[int, int]:
    """(frozen base, adapters) bytes per GPU with LoRA. The base has no gradients or Adam state: its weights in
    `dtype`, partitioned only at stage 3 (plus the largest layer gathered). The adapters train in fp32 whatever
    the dtype (DeepSpeed's half precision is off with LoRA): 4 B weights + 4 B gradients + 8 B Adam per param,
    sharded as the stage says."""
    b = DTYPE_BYTES[dtype]
    base = b * base_params if stage < 3 else b * largest_layer_params + b * base_params // ranks
    return base, model_states_bytes(adapter_params, 0, stage, ranks, "float32")


def activation_bytes_per_token(s: Shape, dtype: str, checkpointing: bool) -> int:
    """Bytes kept for backward per token of a micro-batch, all layers.

    Per layer (SDPA attention, RMSNorm upcast to fp32 as transformers does): in the model's dtype the
    two norms' inputs and outputs (4h), q/k/v and their normed and rotated forms and the attention
    output (4q + 4kv, q = heads × head_dim), the MLP's gate, up, act(gate) and product (4I); in fp32
    the norms' upcast inputs (2h + q + kv, Qwen3 normalising q and k too).
    """
    b = DTYPE_BYTES[dtype]
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    layer = b * (4 * s.hidden + 4 * q + 4 * kv + 4 * s.intermediate) + 4 * (2 * s.hidden + q + kv)
    if checkpointing:
        return s.layers * b * s.hidden + layer  # every layer's input, plus one layer while it is recomputed
    return s.layers * layer


def logprob_chunk_bytes(s: Shape, dtype: str, chunk_tokens: int) -> int:
    """One chunk's full-vocabulary logits: the output layer's (dtype), their fp32 copy, the tempered
    fp32 logits and the gradient of those, live at once when the chunk is (re)computed in backward."""
    return chunk_tokens * s.vocab * (DTYPE_BYTES[dtype] + 3 * 4)


def kv_bytes_per_token(s: Shape, dtype: str) -> int:
    """K and V of every layer for one token."""
    return 2 * s.layers * s.kv_heads * s.head_dim * DTYPE_BYTES[dtype]


class Part(msgspec.Struct):
    """One process kind's need per GPU."""

    what: str
    gpus: int
    per_gpu: int
    lines: list[str]
    fits: bool | None = None
    """None: no --gpu-mem given."""


def sequence_tokens(cfg: Config, prompt_tokens: int) -> tuple[int, str]:
    """Longest sequence (prompt + completion) a step can hold, and where that figure comes from."""
    if cfg.model.max_seq_len:
        return cfg.model.max_seq_len, "model.max_seq_len"
    return prompt_tokens + cfg.actors.max_new_tokens, f"{prompt_tokens} prompt tokens (--prompt-tokens) + actors.max_new_tokens"


def learner_part(cfg: Config, s: Shape, seq: int, gpu_mem: float | None) -> Part:
    L, dtype = cfg.learner, cfg.model.dtype
    ranks = L.ranks
    rows = cfg.learner.batch_groups * cfg.actors.group_size // ranks
    share = rows * seq
    mb_budget = getattr(L, "micro_batch_tokens", 0) or 0
    # Micro-batches hold whole rows (padded to the longest): at least one full-length sequence.
    micro = min(share, max(mb_budget, seq)) if mb_budget else share
    ckpt = bool(getattr(L, "activation_checkpointing", False))
    chunk = getattr(L, "logprob_chunk_tokens", None)
    states = full = model_states_bytes(s.params, s.largest_layer_params, L.zero_stage, ranks, dtype)
    rank = cfg.lora.rank if getattr(cfg, "lora", None) is not None else 0
    if rank:
        base, adapters = lora_model_states_bytes(s.params, s.largest_layer_params, s.adapter_params, L.zero_stage,
                                                 ranks, dtype)
        states = base + adapters
    act = micro * activation_bytes_per_token(s, dtype, ckpt)
    act_other = micro * activation_bytes_per_token(s, dtype, not ckpt)
    # Without chunking (a learner that predates it) the whole micro-batch's logits exist at once.
    logits = logprob_chunk_bytes(s, dtype, min(chunk, micro) if chunk else micro)
    total = states + act + logits
    source = ("DeepSpeed estimate_zero3_model_states_mem_needs" if L.zero_stage == 3 else
              "DeepSpeed estimate_zero2_model_states_mem_needs") if dtype != "float32" else "fp32: 16 B/param by stage"
    if rank:
        full_total = full + act + logits
        lora_lines = [
            f"model states     {total_gb(states)}  ZeRO-{L.zero_stage} over {ranks} rank(s), LoRA rank {rank}: frozen base "
            f"{base / GB:.2f} GB ({dtype}, no gradients or Adam state) + {s.adapter_params / 1e6:.2f} M adapter "
            f"parameters {adapters / GB:.3f} GB (fp32 weights, gradients and Adam, 16 B/param)",
            f"                 full fine-tuning: {full / GB:.2f} GB ({source}); LoRA's are {full / max(states, 1):.1f}x "
            f"smaller, the learner's total {full_total / max(total, 1):.2f}x ({full_total / GB:.1f} -> {total / GB:.1f} GB)",
            f"publish          {4 * s.adapter_params / 1e6:,.1f} MB per version (the fp32 adapters), against "
            f"{DTYPE_BYTES[dtype] * s.params / 1e6:,.1f} MB of full weights",
        ]
    lines = [
        *(lora_lines if rank else
          [f"model states     {total_gb(states)}  ZeRO-{L.zero_stage} over {ranks} rank(s), {dtype} ({source})"]),
        f"activations      {total_gb(act)}  micro-batch {micro:,} tokens ({'learner.micro_batch_tokens' if mb_budget else 'the whole share: learner.micro_batch_tokens=0'}), "
        f"{'with' if ckpt else 'without'} activation checkpointing ({total_gb(act_other).strip()} {'without' if ckpt else 'with'})",
        f"log-prob chunk   {total_gb(logits)}  {min(chunk, micro) if chunk else micro:,} tokens x {s.vocab:,} vocabulary "
        f"({'learner.logprob_chunk_tokens' if chunk else 'unchunked'})",
        f"total            {total_gb(total)}  ({rows} sequences of up to {seq:,} tokens per rank per step)",
    ]
    return Part("learner", ranks, total, lines, None if gpu_mem is None else total <= gpu_mem * GB)


def actor_part(cfg: Config, s: Shape, seq: int, gpu_mem: float | None) -> Part:
    a, dtype = cfg.actors, cfg.model.dtype
    tp = a.engine_gpus()
    weights = s.params * DTYPE_BYTES[dtype] // tp
    per_token = kv_bytes_per_token(s, dtype) // tp
    seqs = a.prompts_per_generate * a.group_size
    kv, one = seqs * seq * per_token, seq * per_token
    total = weights + kv
    lines = [f"weights          {total_gb(weights)}  {s.params / 1e9:.2f} B parameters in {dtype}" + (f" / {tp} GPUs" if tp > 1 else ""),
             f"KV cache         {total_gb(kv)}  {seqs} sequences (prompts_per_generate x group_size) x {seq:,} tokens "
             f"x {per_token:,} B/token; {one / GB:.1f} GB for one",
             f"total            {total_gb(total)}"]
    fits = None
    share = a.engine_memory_fraction()
    if gpu_mem is not None and share is not None:  # the engine reserves its share of the GPU, no more
        lines.append(f"engine's share   {gpu_mem * share:8.1f} GB of the GPU's {gpu_mem:g} (actors.gpu_memory_fraction={share:g})")
        gpu_mem = gpu_mem * share
    if gpu_mem is not None:
        free = gpu_mem * GB - weights
        if total <= gpu_mem * GB:
            fits = True
        elif free >= one:
            held = int(free // one)
            lines.append(f"                 the engine holds {held} of {seqs} full-length sequences at once "
                         f"(runs, more slowly); {math.ceil(total / GB - gpu_mem)} GB short of all")
            fits = True
        else:
            lines.append(f"                 not even one {seq:,}-token sequence fits beside the weights")
            fits = False
    return Part("actors", a.num * tp, total, lines, fits)


def total_gb(n: int) -> str:
    return f"{n / GB:8.1f} GB/GPU"


class Plan(msgspec.Struct):
    shape: Shape
    learner: Part
    actors: Part
    gpus: int | None
    gpu_mem: float | None
    fits: bool | None
    """None: nothing to compare against (no --gpus/--gpu-mem)."""
    problems: list[str]
    header: list[str]


def make(cfg: Config, gpus: int | None = None, gpu_mem: float | None = None, prompt_tokens: int = 256,
         model_config: str | Path | None = None) -> Plan:
    """The plan of `cfg` on `gpus` GPUs of `gpu_mem` GB each (either may be None: not checked)."""
    s = shape(cfg, model_config)
    seq, seq_from = sequence_tokens(cfg, prompt_tokens)
    learner, actors = learner_part(cfg, s, seq, gpu_mem), actor_part(cfg, s, seq, gpu_mem)
    problems = []
    if learner.fits is False:
        problems.append(f"the learner needs {learner.per_gpu / GB:.1f} GB per GPU, more than {gpu_mem:g} GB "
                        "(raise learner.ranks or zero_stage, set learner.micro_batch_tokens, "
                        "learner.activation_checkpointing=true)")
    if actors.fits is False:
        problems.append(f"an actor cannot hold its weights and one full-length sequence in {gpu_mem:g} GB "
                        "(raise actors.tensor_parallel_size or actors.gpu_memory_fraction, or lower model.max_seq_len)")
    need = learner.gpus + actors.gpus
    if gpus is not None and need > gpus:
        problems.append(f"{need} GPUs needed ({learner.gpus} learner + {actors.gpus} actor), {gpus} given "
                        "(lower learner.ranks or actors.num)")
    checked = gpus is not None or gpu_mem is not None
    header = [f"model            {s.name}: {s.params / 1e9:.3f} B parameters (largest layer {s.largest_layer_params / 1e6:.1f} M), "
              f"hidden {s.hidden}, {s.layers} layers, {s.heads}/{s.kv_heads} heads x {s.head_dim}, "
              f"MLP {s.intermediate}, vocab {s.vocab:,}; from {s.source}",
              f"sequence         {seq:,} tokens ({seq_from}); {cfg.learner.batch_groups} groups x "
              f"{cfg.actors.group_size} = {cfg.learner.batch_groups * cfg.actors.group_size} sequences per step"]
    return Plan(s, learner, actors, gpus, gpu_mem, (not problems) if checked else None, problems, header)


def report(plan: Plan, name: str) -> str:
    out = [f"streamrl plan: {name}", *plan.header,
           f"learner: {plan.learner.gpus} GPU(s) (learner.ranks)", *("  " + x for x in plan.learner.lines),
           f"actors: {plan.actors.gpus} GPU(s) (actors.num x tensor_parallel_size)", *("  " + x for x in plan.actors.lines)]
    given = ", ".join(x for x in (f"{plan.gpus} GPUs" if plan.gpus is not None else "",
                                  f"{plan.gpu_mem:g} GB each" if plan.gpu_mem is not None else "") if x)
    if plan.fits is None:
        out.append("verdict: not checked (give --gpus N and --gpu-mem GB)")
    elif plan.fits:
        out.append(f"verdict: fits ({given}; {plan.learner.gpus + plan.actors.gpus} GPUs used)")
    else:
        out.append(f"verdict: DOES NOT FIT ({given}): " + "; ".join(plan.problems))
    return "\n".join(out)


def run_warning(cfg: Config) -> str | None:
    """`streamrl run`'s check: on CUDA, the plan against this machine's GPUs; elsewhere every process
    shares host memory, so the learner's and actors' needs together against the RAM installed.
    None when it fits (or cannot be told). The tiny default model always fits: it is not planned,
    which keeps transformers out of the supervisor's start-up."""
    if cfg.model.path is None:
        return None
    import os

    import torch

    try:
        if torch.cuda.is_available():
            mem = torch.cuda.get_device_properties(0).total_memory / GB
            plan = make(cfg, torch.cuda.device_count(), mem)
            return None if plan.fits else "; ".join(plan.problems)
        plan = make(cfg)
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        need = plan.learner.per_gpu * plan.learner.gpus + plan.actors.per_gpu * plan.actors.gpus
        if need > ram:
            return (f"learner and actors need about {need / GB:.1f} GB together, more than this machine's "
                    f"{ram / GB:.1f} GB of RAM (see `streamrl plan`)")
    except Exception:  # a plan that cannot be made must not stop a run the user asked for
        return None
    return None


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("plan", help="per-GPU memory a config needs (learner and actors), and whether it fits")
    options.add_config(p)
    p.add_argument("--gpus", type=int, default=None, help="GPUs available (learner ranks + actor GPUs must fit)")
    p.add_argument("--gpu-mem", type=float, default=None, help="memory of one GPU in GB (1e9 bytes)")
    p.add_argument("--prompt-tokens", type=int, default=256,
                   help="prompt length assumed when model.max_seq_len is unset (default 256)")
    p.add_argument("--model-config", default=None, help="a config.json to read the model's shape from")


def main(args: argparse.Namespace) -> int:
    if (loaded := options.load(args)) is None:
        return 2
    path, _, cfg = loaded
    try:
        made = make(cfg, args.gpus, args.gpu_mem, args.prompt_tokens, args.model_config)
    except (FileNotFoundError, ValueError) as e:
        print(f"streamrl plan: error: {e}", file=sys.stderr)
        return 2
    print(report(made, path or "default"))
    return 0 if made.fits is not False else 1
