"""A two-tool episode through the release-shaped Qwen3 folder's tokenizer and chat template (tools=, <tool_call>
parsing, <tool_response> turns): the ids held are the template's rendering of the conversation, or drift is
counted where Qwen3's template renders a past turn differently (its empty think block dropped from history)."""

from __future__ import annotations

import json
import textwrap

import pytest

from streamrl import config
from streamrl.actors.environment_episodes import EnvironmentEpisodes
from streamrl.models import release_model
from streamrl.models.sampling import Completion
from streamrl.tasks import rewards
from streamrl.tasks.base import Prompt

ENV = textwrap.dedent('''
    class TwoTools:
        def __init__(self, row):
            self.row = row
            self.tools = [self.lookup, add]

        def lookup(self, key: str) -> str:
            """Look a key up.

            Args:
                key: The key.
            """
            return {"k1": "b"}[key]

        def reset(self):
            return [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": self.row["prompt"]}]

        def step(self, reply):
            return [], 1.0 if "b 5" in reply else 0.0, True


    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: The first.
            b: The second.
        """
        return a + b
''')

CALLS = ('<tool_call>\n{"name": "lookup", "arguments": {"key": "k1"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>')


class Scripted:
    """The model's two turns, as tokens of the folder's tokenizer ending with <|im_end|>: the calls (after a
    reasoning block when `think`), then the answer."""

    def __init__(self, tok, think: bool):
        self.tok, self.turn = tok, 0
        self.replies = [("<think>\nk1 holds a symbol; add the numbers.\n</think>\n\n" if think else "") + CALLS,
                        "The answer is b 5"]

    def generate(self, prompts, n, between_steps=None):
        out = []
        for ids in prompts:
            turn = self.tok.decode(ids).count("<|im_start|>assistant") - 1
            toks = self.tok(self.replies[turn], add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            out.append([Completion(tokens=toks, logprobs=[-1.0] * len(toks), finish_reason="stop")] * n)
        return out


@pytest.fixture(scope="module")
def tok():
    return release_model.build_tokenizer()


def _run(tok, tmp_path, thinking: str, think: bool):
    (tmp_path / "two_tools.py").write_text(ENV)
    cfg = config.load("tiny-tools.yaml", [f"task.environment={tmp_path / 'two_tools.py'}:TwoTools",
                                          "task.tool_parser=qwen3", 'model.chat_template="on"', "model.max_seq_len=4096",
                                          f"model.enable_thinking={thinking}", "actors.group_size=2",
                                          "actors.max_new_tokens=256"])
    reward = rewards.build(cfg)
    runner = EnvironmentEpisodes(cfg, Scripted(tok, think), tok, reward, "actor-0", [tok.eos_token_id])
    groups, stats, _ = runner.make_groups([Prompt(id="p", text="What is k1, and 2 + 3?")], 0)
    runner.close()
    (schemas,) = runner._schemas.values()  # what went in through tools=
    return groups[0], stats, schemas


def test_a_two_tool_episode_holds_exactly_the_templates_rendering(tok, tmp_path):
    group, stats, tools = _run(tok, tmp_path, "null", think=True)
    assert stats.tool_calls == {"lookup/ok": 2, "add/ok": 2} and group.rewards == [1.0, 1.0]
    assert stats.template_drift == 0 and stats.turns == [2, 2]
    ids = [*group.prompt_tokens.tolist(), *group.completion_tokens[:group.samples[0].num_tokens].tolist()]
    text = tok.decode(ids)
    # The tools went in through tools=, the results came back as one user turn of <tool_response> blocks.
    listed = text.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
    assert [json.loads(t)["function"]["name"] for t in listed] == ["lookup", "add"]
    assert json.loads(listed[1])["function"]["parameters"]["properties"] == {
        "a": {"type": "integer", "description": "The first."}, "b": {"type": "integer", "description": "The second."}}
    assert "<tool_response>\nb\n</tool_response>\n<tool_response>\n5\n</tool_response><|im_end|>" in text
    # Token in, token out: everything before the last reply is the template's rendering of the conversation
    # (the kept <think> block included), and the last reply is the model's tokens as sampled.
    messages = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "What is k1, and 2 + 3?"},
                {"role": "assistant", "content": Scripted(tok, True).replies[0]},
                {"role": "tool", "content": "b"}, {"role": "tool", "content": "5"}]
    rendered = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    last = tok("The answer is b 5", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert ids == tok(rendered, add_special_tokens=False)["input_ids"] + last
    mask = group.model_token_mask[:group.samples[0].num_tokens].tolist()
    assert mask[-len(last):] == [True] * len(last) and sum(mask) == len(last) + len(
        tok(Scripted(tok, True).replies[0], add_special_tokens=False)["input_ids"]) + 1


def test_qwen3_dropping_the_empty_think_block_from_history_is_counted_as_drift(tok, tmp_path):
    """enable_thinking=false pre-fills <think>\\n\\n</think> in the generation prompt; Qwen3's template renders a
    past assistant turn without it. The ids held keep it (the model was conditioned on it), and the turn counts."""
    group, stats, _ = _run(tok, tmp_path, "false", think=False)
    assert stats.template_drift == 2 and stats.tool_calls == {"lookup/ok": 2, "add/ok": 2}
    text = tok.decode([*group.prompt_tokens.tolist(), *group.completion_tokens[:group.samples[0].num_tokens].tolist()])
    assert text.count("<think>\n\n</think>\n\n") == 2  # both generation prompts, as the model saw them
    assert "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nb\n</tool_response>" in text
    assert group.rewards == [1.0, 1.0]
