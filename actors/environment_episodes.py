"""rollout "environment" of the episode runtime (`streamrl.actors.rollouts`): episodes of the task's
`environment_class()` (`task.environment`; SkyRL-Gym and OpenEnv environments through their adapters), turns
driven by the actor, tools run on a thread pool.

Every episode of a generate call is in flight at once. Each round, the backend samples one turn for every
episode that is waiting on the model, as one batch; a reply that calls tools hands its calls to a thread pool
(`task.tool_workers`) and the loop goes on generating for the other episodes while they run, so a slow tool
overlaps generation instead of stalling it. A call past `task.tool_timeout_s` is abandoned (Python cannot stop
a thread) and the model is told it timed out. A reply with no tool call goes to the environment's `step`.

Token in, token out (`streamrl.models.conversation`): an episode's ids only ever grow, the model's sampled
tokens kept as sampled. A sample's completion is every id after the opening prompt, the model's turns and the
environment's interleaved; `model_token_masks` says which the model sampled (behaviour log-probs are 0.0 under
the environment's). An episode ends when the environment says done, or truncated at `task.max_turns` model
turns or when no room is left under the sequence cap (`model.max_seq_len`, else the model's context); a
truncated episode that got no reward scores the task's lowest level. The reward `step` gives when done goes on the
task's levels by the runtime's one rule; one on no level fails the episode as a raising `step` does. A None with
done is "could not score" (`reward_health.NONE_RULE`): the episode is unscored, counted `none`, and judged by the
environment's failure window like a raising `step`.

What episodes did is added up in `EpisodeStats` (turns, tool calls by tool and outcome, time in tools,
truncations, template drift) for the actor's report and Prometheus.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import math
import time

from streamrl.config import Config
from streamrl.actors.episodes import Episode, EpisodeRunner, EpisodeStats
from streamrl.actors.rollout import RolloutStats, fill_unscored
from streamrl.models.conversation import Conversation, Renderer
from streamrl.models.sampling import capped
from streamrl.tasks import environments, tool_calls
from streamrl.tasks.adapted import BadReward
from streamrl.tasks.data_errors import data_error
from streamrl.tasks.environments import row_of
from streamrl.tasks.reward_health import NONE_RULE, FailureWindow
from streamrl.tasks.user_frames import user_traceback

log = logging.getLogger("streamrl.actor")

REFUSALS = (ValueError, TypeError, LookupError)
"""What a tool raises to refuse its input (`KeyError("no key x")`, a bad value): the model's mistake, told to it and
counted as `raised`, never a sign that the tool is broken. Any other exception, and a timeout, on most of a tool's
recent calls stops the run (the failure window)."""

OUTCOMES = ("ok", "raised", "timeout", "unknown_tool", "bad_call")
"""A tool call's outcome: returned; raised; ran past task.tool_timeout_s; named no tool; unreadable or its
arguments did not fit the tool."""


class _Episode(Episode):
    def __init__(self, env, conv: Conversation, tools: dict, group: int, row: dict):
        super().__init__(group)
        self.env, self.conv, self.tools, self.row = env, conv, tools, row
        self.calls: list[list] = []  # [call, future | None, started, message if settled]
        self.started = time.perf_counter()
        self.done = False


class EnvironmentEpisodes(EpisodeRunner):
    """rollout "environment": `make_groups(prompts, version)` plays G episodes per prompt of the task's
    `environment_class()`."""

    def __init__(self, cfg: Config, backend, tokenizer, reward, actor_id: str, end_ids: list[int]):
        super().__init__(cfg, backend, tokenizer, reward, actor_id, end_ids)
        t = cfg.task
        self.env_cls = environments.class_of(reward.task, t)
        self.env_args = environments.options_of(self.env_cls, t)  # (its options,) where the class declares them
        self.max_turns, self.timeout_s = t.max_turns, t.tool_timeout_s
        self.parser = None
        self.tool_parser = t.tool_parser
        self.pool = cf.ThreadPoolExecutor(t.tool_workers, thread_name_prefix=f"{actor_id}-tools")
        self._schemas: dict = {}
        # The user's code failing on most episodes (the environment) or calls (a tool) stops the run, as a broken
        # reward function does (reward_health); the model's own bad calls (bad_call, unknown_tool) never count.
        self.env_name = t.environment or self.env_cls.__name__
        self.env_health = FailureWindow(t.reward_fail_window, t.reward_fail_threshold, kind="environment")
        self.tool_health = FailureWindow(t.reward_fail_window, t.reward_fail_threshold, kind="tool")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _renderer(self, tools: dict) -> Renderer:
        key = tuple((getattr(f, "__module__", ""), getattr(f, "__qualname__", n)) for n, f in tools.items())
        if key not in self._schemas:
            self._schemas[key] = [environments.schema(f) for f in tools.values()]
        r = Renderer(self.tokenizer, *self.template, self._schemas[key])
        if self.parser is None:
            self.parser = tool_calls.parser_for(self.tool_parser, r.chat)
        return r

    def _open(self, prompts: list, stats: EpisodeStats, done: RolloutStats) -> list[_Episode]:
        """G started episodes of each prompt; a prompt with one that could not start or has no room is left out."""
        episodes = []
        for g, prompt in enumerate(prompts):
            mine = [e for e in (self._start(prompt, g, stats, done) for _ in range(self.group_size)) if e is not None]
            if len(mine) < self.group_size or any(self.room(e.conv) <= 0 for e in mine):
                done.prompts_too_long += len(mine) == self.group_size
                continue
            episodes += mine
        return episodes

    def _settle(self, mine: list[_Episode], done: RolloutStats) -> bool:
        """An episode the environment failed takes the mean of its group's scored ones, as an unscored sample does
        (rollout.fill_unscored): the model's reply is not what failed. A group with none scored is not sent."""
        if self._bad_data(mine, done):
            return False
        for e, r in zip(mine, fill_unscored([e.reward if e.scored else None for e in mine])):
            e.reward = r
            done.reward_none += e.failure == "none"
        return any(e.scored for e in mine)

    def _start(self, prompt, group: int, stats: EpisodeStats, done: RolloutStats) -> _Episode | None:
        row = row_of(prompt)
        try:
            env = self.env_cls(row, *self.env_args)
            opening = env.reset()
            tools = environments.tools_of(env)
        except Exception as e:  # a broken environment is the user's bug: say where, and skip the prompt
            if why := data_error(row, e):  # ... unless the row lacks what it read: the row is bad, not the code
                self.bad_rows.bad(row, why, self.env_name)
                done.reward_bad_data += 1
                return None
            stats.step_raised += 1
            log.warning("%s: %s could not start an episode of prompt %s: %s: %s", self.actor_id,
                        self.env_cls.__name__, prompt.id, type(e).__name__, e)
            self._env_failed(e)
            return None
        return _Episode(env, Conversation(self._renderer(tools), opening), tools, group, row)

    def _play(self, episodes: list[_Episode], version: int, stats: EpisodeStats) -> None:
        """Every episode to its end: batched turns for those waiting on the model, tools on the pool meanwhile."""
        ready, calling = list(episodes), []
        while ready or calling:
            if ready:
                batch, ready = ready, []
                drawn = self.backend.generate([e.conv.ids for e in batch], 1)
                for e, completions in zip(batch, drawn):
                    self._reply(e, capped(completions[0], max(0, self.room(e.conv))), stats)
                    (calling if e.calls else ready if not e.done else []).append(e)
            if calling:
                # Wait only when nothing else can run; otherwise take what finished and generate again.
                wait_s = None if not ready else 0.0
                pending = [f for e in calling for _, f, _, m in e.calls if f is not None and m is None]
                if pending and wait_s is None:
                    soonest = min(s for e in calling for _, f, s, m in e.calls if f is not None and m is None)
                    cf.wait(pending, timeout=max(0.0, soonest + self.timeout_s - time.perf_counter()),
                            return_when=cf.FIRST_COMPLETED)
                still = []
                for e in calling:
                    if self._answered(e, stats):
                        if not e.done:
                            ready.append(e)
                    else:
                        still.append(e)
                calling = still

    def _reply(self, e: _Episode, completion, stats: EpisodeStats) -> None:
        """The model's turn: hold its tokens; start its tool calls, or hand the reply to the environment."""
        e.turns += 1
        text = e.conv.add_reply(list(completion.tokens), list(completion.logprobs), self.end_ids)
        calls = self.parser(text, list(e.tools)) if e.tools else []
        if calls:
            now = time.perf_counter()
            e.calls = [self._call(e, c, now) for c in calls]
            return
        try:
            messages, reward, done = e.env.step(text)
            if done and reward is not None and math.isfinite(reward) and self.on_level(reward) is None:
                raise BadReward(f"{type(e.env).__name__}.step: the episode's reward {reward:g} is on none of "
                                f"the task's levels {self.task_levels} (tolerance {self.tolerance:g})")
        except Exception as err:
            if why := data_error(e.row, err):  # the row lacks what step read: bad data, not the code's failure
                e.scored, e.failure = False, "bad_data"
                self._end(e, None, "stop")
                return self.bad_rows.bad(e.row, why, self.env_name)
            stats.step_raised += 1
            log.warning("%s: %s.step raised (episode ended, unscored): %s: %s", self.actor_id,
                        type(e.env).__name__, type(err).__name__, err)
            e.scored = False
            self._end(e, None, "stop")
            return self._env_failed(err)
        if done and reward is None:  # the environment could not score it (reward_health.NONE_RULE)
            e.scored, e.failure = False, "none"
            self._end(e, None, "stop")
            return self._env_failed(None, "none", f"{type(e.env).__name__}.step returned reward None with done=True "
                                                  f"(model turn {e.turns}; {NONE_RULE})")
        if done:
            return self._end(e, reward, "stop")
        self._continue(e, list(messages), stats)

    def _call(self, e: _Episode, call: tool_calls.ToolCall, now: float) -> list:
        """[call, future, started, message]: message is set at once for a call that cannot run."""
        if call.error is not None:
            return [call, None, now, self._tool_message(call, f"error: {call.error}", "bad_call")]
        fn = e.tools.get(call.name)
        if fn is None:
            return [call, None, now, self._tool_message(
                call, f"error: no tool {call.name!r}; tools: {', '.join(e.tools)}", "unknown_tool")]
        try:
            args, kwargs = tool_calls.bind(fn, call)
        except TypeError as err:
            return [call, None, now, self._tool_message(call, f"error: {call.name}: {err}", "bad_call")]
        return [call, self.pool.submit(_timed, fn, args, kwargs), now, None]

    @staticmethod
    def _tool_message(call, content: str, outcome: str) -> dict:
        return {"role": "tool", "name": call.name, "content": content, "_outcome": outcome, "_seconds": 0.0}

    def _answered(self, e: _Episode, stats: EpisodeStats) -> bool:
        """Whether every tool call of the episode's reply has an answer (a result, an error, a timeout); then
        their messages are appended and the episode goes on."""
        now = time.perf_counter()
        for item in e.calls:
            call, future, started, message = item
            if message is not None:
                continue
            if future.done():
                try:
                    value, seconds = future.result()
                    item[3] = {**self._tool_message(call, tool_calls.result_text(value), "ok"), "_seconds": seconds}
                except Exception as err:  # the model sees what went wrong; the call is counted
                    item[3] = {**self._tool_message(call, f"error: {call.name} raised {type(err).__name__}: {err}",
                                                    "raised"), "_seconds": now - started,
                               "_error": None if isinstance(err, REFUSALS) else user_traceback(err)}
            elif now - started >= self.timeout_s:
                future.cancel()
                item[3] = {**self._tool_message(call, f"error: {call.name} timed out after {self.timeout_s:g}s",
                                                "timeout"), "_seconds": self.timeout_s}
        if any(m is None for _, _, _, m in e.calls):
            return False
        messages = []
        for _, _, _, m in e.calls:
            # Labelled by the tool's own name only: a name the model made up must not mint a new series.
            key = f"{m['name'] if m['name'] in e.tools else '(unknown)'}/{m['_outcome']}"
            stats.tool_calls[key] = stats.tool_calls.get(key, 0) + 1
            e.tool_calls[key] += 1
            refused = m["_outcome"] == "raised" and m.get("_error") is None  # the model's input: not the tool's fault
            if m["_outcome"] in ("ok", "raised", "timeout") and m["name"] in e.tools and not refused:
                self._tool_fate(m["name"], m["_outcome"], m.get("_error"))
            stats.tool_s += m["_seconds"]
            messages.append({k: v for k, v in m.items() if not k.startswith("_")})
        e.calls = []
        self._continue(e, messages, stats)
        return True

    def _continue(self, e: _Episode, messages: list[dict], stats: EpisodeStats) -> None:
        """Append the environment's messages and the next generation prompt, or end the episode truncated."""
        if e.turns >= self.max_turns:
            stats.truncated["max_turns"] = stats.truncated.get("max_turns", 0) + 1
            return self._end(e, None, "length")
        e.conv.add_messages(messages)
        if self.seq_cap and len(e.conv.ids) > self.seq_cap:  # the environment's turn overflows: cut it at the cap
            e.conv.cut(self.seq_cap)
        if self.room(e.conv) <= 0:
            stats.truncated["max_seq_len"] = stats.truncated.get("max_seq_len", 0) + 1
            return self._end(e, None, "length")

    def _env_failed(self, err: BaseException | None, why: str = "raised", detail: str = "") -> None:
        """An episode the environment's reset or step ended by raising (err), or left unscored (why "none");
        raises UserCodeFailure once most of the window's episodes did."""
        self.failures[f"environment_{why}"] += 1
        self.env_health.note(self.env_name, why, detail or user_traceback(err))
        self.env_health.record(self.env_name, why, self.failures)

    def _tool_fate(self, name: str, outcome: str, detail: str | None) -> None:
        """A call of tool `name` ended `outcome` (ok, raised, timeout); raises UserCodeFailure once most of its
        window's calls failed."""
        if outcome != "ok":
            self.failures[f"tool_{outcome}"] += 1
            self.tool_health.note(name, outcome, detail or f"a call took longer than task.tool_timeout_s="
                                                           f"{self.timeout_s:g} (abandoned)")
        self.tool_health.record(name, None if outcome == "ok" else outcome, self.failures)

    def _end(self, e: _Episode, reward: float | None, finish: str) -> None:
        e.done, e.finish, e.ended = True, finish, time.perf_counter()
        try:  # an environment holding a connection or a process lets it go however the episode ended
            getattr(e.env, "close", lambda: None)()
        except Exception as err:
            log.warning("%s: %s.close raised: %s: %s", self.actor_id, type(e.env).__name__, type(err).__name__, err)
        if e.scored:  # the environment did its part (a raise is recorded by _env_failed), and so did its row
            self.env_health.record(self.env_name, None, self.failures)
            self.bad_rows.good()
        value = self.lowest if reward is None or not math.isfinite(reward) else \
            self.reward.shape(self.on_level(float(reward)))
        e.reward = value


def _timed(fn, args, kwargs):
    t0 = time.perf_counter()
    return fn(*args, **kwargs), time.perf_counter() - t0
