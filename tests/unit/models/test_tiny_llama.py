"""streamrl.models.tiny_llama against transformers' LlamaForCausalLM: the weights a seed gives, logits on a
left-padded batch, cached decoding, the learner's hidden states and gradients, bfloat16, export (the lean
sampler on it against transformers' `generate`: tests/unit/models/test_sampling.py)."""

from __future__ import annotations

import pytest
import torch

from streamrl import config
from streamrl.learner.engine import recompute_layers_in_backward
from streamrl.models import model as model_lib
from streamrl.models import sampling
from streamrl.models.tiny_llama import KVCache, TinyLlamaConfig, to_transformers


def _transformers_build(cfg, tok):
    """The default model exactly as streamrl.models.model.build made it with transformers (before tiny_llama)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    m = cfg.model
    hc = LlamaConfig(vocab_size=len(tok), hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                     num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads, num_key_value_heads=m.num_heads,
                     max_position_embeddings=m.context, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                     eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        return LlamaForCausalLM(hc).to(getattr(torch, m.dtype))


@pytest.fixture(scope="module")
def pair():
    """(native, transformers, tokenizer): the default job's model, built both ways from its seed."""
    cfg = config.load(None, ["seed=7"])
    native, tok = model_lib.build(cfg)
    return native.eval(), _transformers_build(cfg, tok).eval(), tok


def _left_padded(tok):
    rows = [tok("copy : a b c d =", add_special_tokens=False)["input_ids"],
            tok("reverse : a =", add_special_tokens=False)["input_ids"]]
    ids, mask = sampling.left_pad(rows, tok.pad_token_id)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def test_a_seed_gives_the_weights_transformers_gave_under_the_same_names(pair):
    native, hf, _ = pair
    mine, theirs = native.state_dict(), hf.state_dict()
    assert list(mine) == list(theirs)  # names and order: checkpoints, the weight broadcast's layout
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    other, _ = model_lib.build(config.load(None, ["seed=8"]))
    assert not torch.equal(other.state_dict()["lm_head.weight"], mine["lm_head.weight"])


@pytest.mark.parametrize("padded", [True, False])
def test_logits_equal_transformers_on_a_batch(pair, padded):
    native, hf, tok = pair
    ids, mask, positions = _left_padded(tok)
    kwargs = dict(attention_mask=mask, position_ids=positions) if padded else {}
    with torch.no_grad():
        mine, theirs = native(ids, **kwargs).logits, hf(ids, **kwargs).logits
        last = native(ids, logits_to_keep=1, **kwargs).logits
    assert mine.shape == theirs.shape == (2, ids.shape[1], model_lib.vocab_size(native))
    assert (mine - theirs).abs().max() <= 1e-5
    assert (last - mine[:, -1:]).abs().max() <= 1e-5  # the last position only (a 1-row matmul may round apart)


@pytest.mark.parametrize("padded", [True, False])
def test_cached_decoding_equals_transformers_step_by_step(pair, padded):
    from transformers.cache_utils import DynamicCache

    native, hf, tok = pair
    ids, mask, positions = _left_padded(tok)
    mask, positions = (mask, positions) if padded else (None, torch.arange(ids.shape[1]).expand(2, -1))
    caches = KVCache(), DynamicCache(config=hf.config)
    token = ids
    with torch.no_grad():
        for step in range(4):  # the prompt, then one token at a time against the growing caches
            outs = [m(token, attention_mask=mask, position_ids=positions, past_key_values=c, use_cache=True,
                      logits_to_keep=1).logits for m, c in zip((native, hf), caches)]
            assert (outs[0] - outs[1]).abs().max() <= 1e-5, step
            token = outs[0][:, -1].argmax(-1, keepdim=True)
            positions = positions[:, -1:] + 1
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones((2, 1))], dim=-1)
    assert caches[0].get_seq_length() == caches[1].get_seq_length() == ids.shape[1] + 3


@pytest.mark.parametrize("recompute", [False, True])
def test_the_learners_hidden_states_log_probs_and_gradients_equal_transformers(recompute):
    from streamrl.learner import logprobs

    cfg = config.load(None)
    native, tok = model_lib.build(cfg)
    hf = to_transformers(native)
    assert hf.state_dict().keys() == native.state_dict().keys()
    ids = torch.tensor([[5, 6, 7, 8, 9, 0, 0], [9, 10, 11, 4, 5, 6, 7]])  # right-padded, as the learner's batch
    mask = (ids != tok.pad_token_id).long()
    got = []
    for m in (native, hf):
        if recompute:
            recompute_layers_in_backward(m)
        m.train()
        h = logprobs.hidden_states(m, m, ids, mask)  # through the decoder's forward hook, as the engine calls it
        logp, _ = logprobs.token_logprobs(m.get_output_embeddings(), h, ids, mask[:, 1:].bool(), temperature=0.7,
                                          chunk_tokens=4)
        logp.sum().backward()
        got.append((h.detach(), logp.detach(), {k: p.grad for k, p in m.named_parameters()}))
    (h0, lp0, g0), (h1, lp1, g1) = got
    assert (h0 - h1).abs().max() <= 1e-5 and (lp0 - lp1).abs().max() <= 1e-5
    assert g0.keys() == g1.keys() and max(float((g0[k] - g1[k]).abs().max()) for k in g0) <= 1e-5
    assert float(g0["model.embed_tokens.weight"][tok.pad_token_id].abs().max()) == 0.0  # padding_idx: no gradient


def test_transformers_generate_asks_for_the_transformers_twin(pair):
    """The lean sampler against transformers' generate on the twin: tests/unit/models/test_sampling.py."""
    native, _, tok = pair
    with pytest.raises(TypeError, match="to_transformers"):
        sampling.generate_hf(native, [[3, 4]], 1, temperature=1.0, max_new_tokens=2, pad_id=tok.pad_token_id,
                             eos_id=tok.eos_token_id)


def test_a_bfloat16_model_equals_transformers_in_bfloat16():
    cfg = config.load(None, ["model.dtype=bfloat16"])
    native, tok = model_lib.build(cfg)
    hf = _transformers_build(cfg, tok)
    assert native.model.rotary_emb.inv_freq.dtype == hf.model.rotary_emb.inv_freq.dtype == torch.bfloat16
    ids, mask, positions = _left_padded(tok)
    with torch.no_grad():
        mine = native.eval()(ids, attention_mask=mask, position_ids=positions).logits
        theirs = hf.eval()(ids, attention_mask=mask, position_ids=positions).logits
    assert mine.dtype == torch.bfloat16 and torch.equal(mine, theirs)


def test_the_export_folder_loads_in_transformers_with_the_same_weights(pair, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from streamrl.actors.backends.export import hf_folder

    native, _, tok = pair
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    folder = hf_folder(config.load(None), native, tok)
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    assert type(loaded).__name__ == "LlamaForCausalLM"
    state = native.state_dict()
    assert all(torch.equal(v, state[k]) for k, v in loaded.state_dict().items())


def test_a_config_the_native_model_does_not_build_is_refused_in_one_line():
    with pytest.raises(ValueError, match="num_key_value_heads=2 must equal num_attention_heads=4"):
        TinyLlamaConfig(vocab_size=10, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2)


def test_the_engines_layer_recompute_switch_reaches_transformers_without_its_deprecation_warning():
    """The learner turns recompute on through one function for both model kinds; on a transformers model it
    must use the current name (the old one warns that it is removed in v6) and still recompute."""
    import warnings

    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16)
    ids = torch.randint(0, 64, (2, 6))
    weights = Qwen3ForCausalLM(cfg).state_dict()
    grads = []
    for recompute in (False, True):
        m = Qwen3ForCausalLM(cfg)
        m.load_state_dict(weights)
        if recompute:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                recompute_layers_in_backward(m)
            assert m.is_activation_checkpointing
        m.train()
        m(input_ids=ids, use_cache=False).logits.sum().backward()
        grads.append(m.model.layers[0].mlp.up_proj.weight.grad)
    torch.testing.assert_close(grads[0], grads[1])
