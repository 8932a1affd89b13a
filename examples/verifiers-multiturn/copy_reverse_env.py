"""A two-turn verifiers environment in verifiers' own classic style (`vf.MultiTurnEnv`), nothing in it about
streamrl: the model copies the symbols, the environment asks for them reversed, the model answers again; half the
reward for each turn right (levels 0, 0.5, 1). docs/guides/verifiers.md shows this file;
tests/unit/tasks/test_verifiers_env.py plays it on the tiny model."""

import itertools

import verifiers as vf
from datasets import Dataset


class CopyThenReverse(vf.MultiTurnEnv):
    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs) -> vf.Messages:
        """The environment's turn after each model turn: ask for the symbols reversed."""
        return [vf.UserMessage(content=f"reverse : {state['answer']} =")]

    @vf.stop
    async def both_answered(self, state: vf.State) -> bool:
        """Ends the rollout once the model has written two replies (checked by verifiers' is_completed)."""
        return len(state["trajectory"]) >= 2


def load_environment(symbols: str = "abc", length: int = 3, **kwargs) -> vf.Environment:
    rows = [{"question": f"copy : {' '.join(s)} =", "answer": " ".join(s)}
            for s in itertools.product(symbols, repeat=length)]

    def turns_right(completion, answer, **kwargs) -> float:
        """Half for the copy, half for the reversal."""
        replies = [(m["content"] or "").split() for m in completion if m["role"] == "assistant"] + [[], []]
        target = answer.split()
        return 0.5 * (replies[0] == target) + 0.5 * (replies[1] == target[::-1])

    return CopyThenReverse(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[turns_right]), **kwargs)
