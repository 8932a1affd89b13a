"""streamrl.sampling: one sampler for actors and evaluation; teacher forcing agrees with it."""

from __future__ import annotations

import pytest
import torch

from streamrl import config, sampling
from streamrl import model as model_lib


@pytest.fixture(scope="module")
def policy():
    model, tok = model_lib.build(config.load(None))
    return model.eval(), tok


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
