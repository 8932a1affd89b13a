"""Agents written against the `openai` client, unchanged: `task.name: agent`.

    def my_agent(client: openai.OpenAI, row: dict) -> float | dict[str, float]:
        reply = client.chat.completions.create(model="policy", messages=row["prompt"])
        return score(reply.choices[0].message.content, row)

`task.agent` names the function ('package.module:fn' or 'path/file.py:fn'; an `async def` one is given an
`openai.AsyncOpenAI` and runs as a coroutine on the endpoint's loop). Each episode calls it once with a
client pointed at the actor's own OpenAI-compatible endpoint (`streamrl.actors.endpoint`) and the row (its
"prompt" and other columns from `task.data`, and "id"); every model call it makes is one turn of the episode,
sampled by the actor's engine, and its return is the episode's reward (a dict: rewards by name, summed). Rows
come from `task.data` as for `task.name: dataset`; the reward's scale is `task.reward_levels` or
`reward.bucket_edges`. The episodes themselves are run by `streamrl.actors.agents`.
"""

from __future__ import annotations

from streamrl.config import TaskConfig
from streamrl.tasks import plugins
from streamrl.tasks.base import Prompt
from streamrl.tasks.dataset import DatasetTask


def load(ref: str):
    """The agent function `ref` names; ValueError when it is not callable."""
    fn = plugins.resolve(ref, "task.agent", "fn")
    if not callable(fn):
        raise ValueError(f"task.agent={ref!r}: names a {type(fn).__name__}, not a function fn(client, row)")
    return fn


class AgentTask(DatasetTask):
    """Rows from `task.data`; each sample is an episode of the agent `task.agent`, which returns its reward."""

    grouped = False  # scored by its episodes (streamrl.actors.agents), never by reward functions

    def __init__(self, cfg: TaskConfig):
        if not cfg.agent:
            raise ValueError("task agent needs task.agent ('module:fn')")
        self._rows(cfg, "task agent")
        self.functions = None
        self.agent_fn = load(cfg.agent)

    def close(self) -> None:
        pass  # no reward functions: the agents' threads belong to the actor's episode runner

    def score(self, prompt: Prompt, completion: str) -> float:
        raise ValueError("task agent: a sample is scored by its agent's episode; single-completion scoring "
                         "(eval.every, streamrl eval) is not supported for agents yet")
