"""A verifiers environment in verifiers' own style: copy four symbols back, partial credit per position.

Nothing here knows about streamrl: `vf-eval copy_env` (or any verifiers trainer) would load it the same way.
"""

import itertools

import verifiers as vf
from datasets import Dataset


def load_environment(symbols: str = "abcd", length: int = 4, **kwargs) -> vf.Environment:
    rows = [{"question": f"copy : {' '.join(s)} =", "answer": " ".join(s)}
            for s in itertools.product(symbols, repeat=length)]
    parser = vf.Parser()

    def copied(completion, answer, **kwargs) -> float:
        """The share of positions written back right."""
        said = (parser.parse_answer(completion) or "").split()
        target = answer.split()
        return sum(a == b for a, b in zip(said, target)) / len(target)

    rubric = vf.Rubric(funcs=[copied], weights=[1.0], parser=parser)
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), parser=parser, rubric=rubric, **kwargs)
