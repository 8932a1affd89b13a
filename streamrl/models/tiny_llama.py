"""The tiny default policy in plain torch: transformers' LlamaForCausalLM, for the config streamrl builds,
without importing transformers' modeling code.

That import (modeling_utils, torch._dynamo, torch.distributed.tensor, sympy, ...) took 3.4 s of the
5.6 s a CPU run spent before it could fork its learner and actors, for a model of a few layers. This
module computes what transformers computes, op for op, so a seed gives the same weights and the same
logits (tests/unit/models/test_tiny_llama.py loads one set of weights into both and compares logits on a
left-padded batch, cached decoding, hidden states and gradients):

- the same modules and state-dict names (`model.embed_tokens.weight`, `model.layers.N.self_attn.q_proj.weight`,
  `...mlp.gate_proj.weight`, `...input_layernorm.weight`, `model.norm.weight`, `lm_head.weight`), so
  checkpoints, the weight broadcast and `load_state_dict` see no difference;
- the same initialisation in the same order of random draws (torch's default init of each layer as it
  is built, then normal(0, initializer_range) over the decoder, then the output layer built and
  re-drawn), so `streamrl.models.model.build` gives the weights it gave with transformers for a seed;
- RMSNorm in fp32 (eps 1e-6), rotary embeddings (theta 10,000, cos/sin computed in fp32 from
  position ids), SDPA attention with transformers' masks: none (SDPA's `is_causal`) when nothing is
  padded, else a boolean (B, 1, q, kv) causal-and-padding mask; SiLU-gated MLP.

Only what streamrl uses: full multi-head attention (as many key/value heads as query heads), no
sliding window, no packed sequences, no rope scaling. `to_transformers` gives the transformers model
with the same weights (exporting to vLLM/SGLang folders, TRL, and `model.generate` as the reference
sampler), importing transformers only then.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass
class TinyLlamaConfig:
    """LlamaConfig's fields that this model reads, with LlamaConfig's defaults."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    initializer_range: float = 0.02
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    tie_word_embeddings: bool = False
    final_logit_softcapping: float | None = None  # read by the learner (Gemma-style softcap); Llama has none
    model_type: str = "llama"

    def __post_init__(self):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.num_key_value_heads != self.num_attention_heads:
            raise ValueError(f"tiny Llama: num_key_value_heads={self.num_key_value_heads} must equal "
                             f"num_attention_heads={self.num_attention_heads} (grouped-query attention is not built)")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"tiny Llama: hidden_size={self.hidden_size} is not a multiple of "
                             f"num_attention_heads={self.num_attention_heads}")
        if self.tie_word_embeddings:
            raise ValueError("tiny Llama: tie_word_embeddings is not built (streamrl's tiny model unties them)")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def get_text_config(self, decoder: bool = False) -> "TinyLlamaConfig":
        return self


class KVCache:
    """Keys and values of every layer, grown by concatenation along the sequence, as transformers'
    DynamicCache does: each (B, heads, T, head_dim)."""

    def __init__(self):
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def update(self, key: torch.Tensor, value: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Append layer `layer`'s new (B, heads, q, head_dim) keys and values; returns all of them so far."""
        if layer == len(self.keys):
            self.keys.append(key)
            self.values.append(value)
        else:
            self.keys[layer] = torch.cat([self.keys[layer], key], dim=-2)
            self.values[layer] = torch.cat([self.values[layer], value], dim=-2)
        return self.keys[layer], self.values[layer]

    def get_seq_length(self, layer: int = 0) -> int:
        return self.keys[layer].shape[-2] if layer < len(self.keys) else 0


class DecoderOutput(NamedTuple):
    last_hidden_state: torch.Tensor
    """(B, L, H) after the final norm."""
    past_key_values: object | None = None


class CausalLMOutput(NamedTuple):
    logits: torch.Tensor
    """(B, L', V): L' = L, or the last `logits_to_keep` positions."""
    past_key_values: object | None = None


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(..., H) → (..., H), normalised in fp32 and cast back before the weight, as transformers does."""
        dtype = h.dtype
        h = h.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, config: TinyLlamaConfig):
        super().__init__()
        dim = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        # A buffer, not saved, cast by `model.to(dtype)` as transformers' is (a bf16 model rounds it alike).
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids (B or 1, L) → cos, sin (B or 1, L, head_dim) in x's dtype, computed in fp32."""
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype=x.dtype), emb.sin().to(dtype=x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: TinyLlamaConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim ** -0.5
        width = config.num_attention_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.o_proj = nn.Linear(width, config.hidden_size, bias=False)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                cache) -> torch.Tensor:
        """h (B, q, H); cos, sin (B or 1, q, head_dim); mask (B, 1, q, kv) bool or None (causal, unpadded)."""
        shape = (*h.shape[:-1], -1, self.head_dim)
        q = self.q_proj(h).view(shape).transpose(1, 2)  # (B, heads, q, head_dim)
        k = self.k_proj(h).view(shape).transpose(1, 2)
        v = self.v_proj(h).view(shape).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = (q * cos) + (_rotate_half(q) * sin)
        k = (k * cos) + (_rotate_half(k) * sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        # transformers' SDPA call: is_causal only for a prompt without a mask; one new token sees everything.
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=self.scaling,
                                             is_causal=q.shape[2] > 1 and mask is None)
        out = out.transpose(1, 2).contiguous()
        return self.o_proj(out.reshape(*h.shape[:-1], -1).contiguous())


class MLP(nn.Module):
    def __init__(self, config: TinyLlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: TinyLlamaConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                cache=None) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


def causal_mask(attention_mask: torch.Tensor | None, batch: int, q_len: int, past: int,
                device: torch.device | None = None) -> torch.Tensor | None:
    """transformers' SDPA mask for `q_len` new tokens after `past` cached ones: None where SDPA's own
    causal flag (or, for one token, no mask) is exact, i.e. nothing is padded and the query is one token
    or the whole sequence; else (B, 1, q_len, past + q_len) bool, True where a query may attend.

    attention_mask: (B, ≥ past + q_len) 1 for real tokens, 0 for padding (cut or zero-padded to size)."""
    kv_len = past + q_len
    padding = None
    if attention_mask is not None:
        padding = attention_mask.to(device=device, dtype=torch.bool)
        if padding.shape[-1] < kv_len:
            padding = F.pad(padding, (0, kv_len - padding.shape[-1]))
        padding = padding[:, :kv_len]
    if (q_len == 1 or kv_len == q_len) and (padding is None or bool(padding.all())):
        return None
    q_idx = torch.arange(q_len, device=device) + past
    kv_idx = torch.arange(kv_len, device=device)
    mask = (kv_idx[None, None, None, :] <= q_idx[None, None, :, None])  # (1, 1, q, kv)
    if padding is not None:
        mask = mask & padding[:, None, None, :]
    return mask.expand(batch, -1, q_len, kv_len)


class TinyLlamaModel(nn.Module):
    """The decoder: embeddings, layers, final norm (transformers' LlamaModel)."""

    def __init__(self, config: TinyLlamaConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)
        self.gradient_checkpointing = False

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values=None,
                use_cache: bool | None = None) -> DecoderOutput:
        """input_ids (B, q); attention_mask (B, past + q); position_ids (B, q), default past..past+q-1."""
        h = self.embed_tokens(input_ids)
        checkpointing = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        if checkpointing:  # the recompute would append to the cache a second time
            past_key_values = None
        elif use_cache and past_key_values is None:
            past_key_values = KVCache()
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        q_len = input_ids.shape[1]
        if position_ids is None:
            position_ids = (torch.arange(q_len, device=h.device) + past).unsqueeze(0)
        mask = causal_mask(attention_mask, input_ids.shape[0], q_len, past, h.device)
        cos, sin = self.rotary_emb(h, position_ids)
        for layer in self.layers:
            if checkpointing:
                from torch.utils.checkpoint import checkpoint

                h = checkpoint(layer, h, cos, sin, mask, use_reentrant=False)
            else:
                h = layer(h, cos, sin, mask, past_key_values)
        return DecoderOutput(self.norm(h), past_key_values)


class TinyLlamaForCausalLM(nn.Module):
    """transformers' LlamaForCausalLM for streamrl's tiny default (see the module docstring)."""

    generation_config = None  # end tokens come from the tokenizer alone, as for a LlamaConfig built from it

    def __init__(self, config: TinyLlamaConfig):
        super().__init__()
        self.config = config
        self.model = TinyLlamaModel(config)
        # transformers initialises the decoder (post_init) before it builds the output layer, whose default
        # init draws in between: the same order of draws gives the same weights for a seed.
        self._init_decoder()
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        with torch.no_grad():
            self.lm_head.weight.normal_(mean=0.0, std=config.initializer_range)

    @torch.no_grad()
    def _init_decoder(self) -> None:
        std = self.config.initializer_range
        embed = self.model.embed_tokens
        embed.weight.normal_(mean=0.0, std=std)
        if embed.padding_idx is not None:
            embed.weight[embed.padding_idx].zero_()
        for layer in self.model.layers:  # norms keep their ones; every projection is redrawn, in module order
            a, m = layer.self_attn, layer.mlp
            for linear in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj):
                linear.weight.normal_(mean=0.0, std=std)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return True

    def new_cache(self) -> KVCache:
        """An empty KV cache for incremental decoding (what `streamrl.models.sampling.generate` passes)."""
        return KVCache()

    def get_decoder(self) -> TinyLlamaModel:
        return self.model

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs: dict | None = None) -> None:
        """Recompute each layer in backward (torch.utils.checkpoint, non-reentrant; the only kind built)."""
        if (activation_checkpointing_kwargs or {}).get("use_reentrant", False):
            raise ValueError("tiny Llama: only non-reentrant checkpointing (use_reentrant=False) is built")
        self.model.gradient_checkpointing = True

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values=None, use_cache: bool | None = None,
                logits_to_keep: int = 0) -> CausalLMOutput:
        """input_ids (B, q) → logits (B, q, V), or of the last `logits_to_keep` positions (0: all)."""
        out = self.model(input_ids, attention_mask, position_ids, past_key_values, use_cache)
        h = out.last_hidden_state[:, slice(-logits_to_keep, None), :]
        return CausalLMOutput(self.lm_head(h), out.past_key_values)


def transformers_config(config: TinyLlamaConfig):
    """The transformers LlamaConfig of the same model (imports transformers' config classes)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps, rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        initializer_range=config.initializer_range, pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, tie_word_embeddings=False)


def to_transformers(model: TinyLlamaForCausalLM):
    """transformers' LlamaForCausalLM holding a copy of `model`'s weights, in its dtype and on its device
    (imports transformers' modeling code: for exports, TRL and reference checks, never a run's start-up)."""
    from transformers import LlamaForCausalLM

    param = next(model.parameters())
    hf = LlamaForCausalLM(transformers_config(model.config)).to(device=param.device, dtype=param.dtype)
    hf.load_state_dict(model.state_dict(), strict=True)
    return hf.train(model.training)
