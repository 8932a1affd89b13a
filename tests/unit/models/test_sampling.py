"""streamrl.models.sampling: one sampler for actors and evaluation; teacher forcing agrees with it."""

from __future__ import annotations

import pytest
import torch

from streamrl import config
from streamrl.models import model as model_lib
from streamrl.models import sampling


@pytest.fixture(scope="module")
def policy():
    model, tok = model_lib.build(config.load(None))
    return model.eval(), tok


@pytest.fixture(scope="module")
def reference(policy):
    """transformers' LlamaForCausalLM with the policy's weights: what `generate_hf` (model.generate) samples."""
    from streamrl.models.tiny_llama import to_transformers

    return to_transformers(policy[0]).eval()


def test_teacher_forced_logprobs_equal_the_behaviour_logprobs_of_left_padded_samples(policy):
    model, tok = policy
    prompts = [tok("copy : a b c d =", add_special_tokens=False)["input_ids"],
               tok("reverse : a =", add_special_tokens=False)["input_ids"]]  # different lengths: padding matters
    torch.manual_seed(0)
    out = sampling.generate(model, prompts, 3, temperature=1.0, max_new_tokens=5, pad_id=tok.pad_token_id,
                            eos_id=tok.eos_token_id)
    assert [len(g) for g in out] == [3, 3]
    flat = [(p, c) for p, group in zip(prompts, out) for c in group]
    scored = sampling.sequence_logprobs(model, [p for p, _ in flat], [c.tokens for _, c in flat], tok.pad_token_id)
    assert scored == pytest.approx([sum(c.logprobs) for _, c in flat], abs=1e-4)


def test_a_completion_ends_after_its_first_eos():
    tokens, logp = torch.tensor([5, 1, 7, 1]), torch.tensor([-0.1, -0.2, -0.3, -0.4])
    c = sampling._cut(tokens, logp, eos_id=1)
    assert (c.tokens, c.finish_reason) == ([5, 1], "stop") and c.logprobs == pytest.approx([-0.1, -0.2])
    c = sampling._cut(tokens, logp, eos_id=9)
    assert (c.tokens, c.finish_reason) == ([5, 1, 7, 1], "length")


def test_weights_loaded_between_decoding_steps_sample_the_later_tokens_and_set_the_version_span(policy):
    model, tok = policy
    old = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(1)
    new = {k: v + 0.5 * torch.randn_like(v) for k, v in old.items()}  # far enough to change every log-prob
    calls = []

    def between_steps() -> int:
        calls.append(len(calls))
        if len(calls) == 3:  # after tokens 0 and 1: token 2 onwards come from version 1
            model.load_state_dict(new)
        return 1 if len(calls) >= 3 else 0

    prompts = [tok("copy : a b c d =", add_special_tokens=False)["input_ids"]]
    try:
        torch.manual_seed(0)
        out = sampling.generate(model, prompts, 6, temperature=1.0, max_new_tokens=5, pad_id=tok.pad_token_id,
                                eos_id=tok.eos_token_id, between_steps=between_steps)[0]
    finally:
        model.load_state_dict(old)
    assert len(calls) == 1 + max(len(c.tokens) for c in out)  # once before decoding, then after every step
    for c in out:
        assert c.versions == ((0, 1) if len(c.tokens) > 2 else (0, 0))
    c = max(out, key=lambda c: len(c.tokens))
    assert len(c.tokens) > 2
    # Each token's log-prob under the old weights, teacher-forced: the first two match what the
    # sampler recorded; from token 2 on the recorded ones come from the new weights, so they do not.
    prefix = [sampling.sequence_logprobs(model, prompts, [c.tokens[:k]], tok.pad_token_id)[0]
              for k in range(len(c.tokens) + 1)]
    teacher = [b - a for a, b in zip(prefix, prefix[1:])]
    assert teacher[:2] == pytest.approx(c.logprobs[:2], abs=1e-4)
    assert all(abs(t - lp) > 1e-3 for t, lp in zip(teacher[2:], c.logprobs[2:]))


def test_without_between_steps_completions_carry_no_version_span(policy):
    model, tok = policy
    out = sampling.generate(model, [[3, 4]], 2, temperature=1.0, max_new_tokens=3, pad_id=tok.pad_token_id,
                            eos_id=tok.eos_token_id)
    assert all(c.versions is None for c in out[0])


@pytest.mark.parametrize("temperature,top_p,max_new_tokens", [(1.0, 1.0, 4), (0.7, 0.9, 12), (1.3, 1.0, 20)])
def test_the_lean_loop_draws_the_same_tokens_and_logprobs_as_transformers_generate(policy, reference, temperature,
                                                                                    top_p, max_new_tokens):
    model, tok = policy
    prompts = [tok("copy : a b c d =", add_special_tokens=False)["input_ids"],
               tok("reverse : a =", add_special_tokens=False)["input_ids"]]  # padding, and rows ending early
    drawn = []
    for fn, m in ((sampling.generate_hf, reference), (sampling.generate, model)):
        torch.manual_seed(3)
        versions = iter(range(100))
        drawn.append(fn(m, prompts, 8, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                        pad_id=tok.pad_token_id, eos_id=[tok.eos_token_id, 5], between_steps=lambda: next(versions)))
    assert drawn[1] == drawn[0]  # tokens, log-probs (bit for bit), finish reasons and version spans
    assert len({len(c.tokens) for g in drawn[1] for c in g}) > 1  # rows finished at different steps


def test_equal_length_prompts_without_padding_draw_as_generate_does(policy, reference):
    model, tok = policy
    prompts = [tok("copy : a b =", add_special_tokens=False)["input_ids"]] * 2
    drawn = []
    for fn, m in ((sampling.generate_hf, reference), (sampling.generate, model)):
        torch.manual_seed(5)
        drawn.append(fn(m, prompts, 4, temperature=1.0, max_new_tokens=6, pad_id=tok.pad_token_id,
                        eos_id=tok.eos_token_id))
    assert drawn[1] == drawn[0]
