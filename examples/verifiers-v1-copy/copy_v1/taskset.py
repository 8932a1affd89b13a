"""copy-v1: write back the symbols of the prompt (a verifiers v1 taskset, as `vf-init copy-v1 -H` lays one out)."""

import itertools

import verifiers.v1 as vf


class CopyData(vf.TaskData):
    answer: str
    """The symbols to write back, space-separated."""


class CopyTask(vf.Task[CopyData]):
    @vf.reward(weight=1.0)
    async def copied(self, trace: vf.Trace) -> float:
        """The share of positions written back right."""
        said = trace.last_reply.split()
        target = self.data.answer.split()
        return sum(a == b for a, b in zip(said, target)) / len(target)


class CopyConfig(vf.TasksetConfig):
    symbols: str = "abcd"
    """The alphabet."""
    length: int = 4
    """Symbols per task: one task per string of this length."""


class CopyTaskset(vf.Taskset[CopyTask, CopyConfig]):
    def load(self) -> list[CopyTask]:
        return [CopyTask(CopyData(prompt=f"copy : {' '.join(s)} =", answer=" ".join(s)), self.config.task)
                for s in itertools.product(self.config.symbols, repeat=self.config.length)]
