"""rollout "agent" of the episode runtime (`streamrl.actors.rollouts`): the task's `agent_fn` (`task.name: agent`:
the user's agent code, unchanged; both verifiers stacks through their tasks) drives each episode through the
`openai` client, and the actor's own engine answers it.

Each generate call plays G episodes per prompt: the agent is called as fn(client, row) on a thread of its
own (at most `task.agent_workers` at once), with `client` an `openai.OpenAI` pointed at the actor's endpoint
(`streamrl.actors.endpoint`; its transport calls the endpoint's app in process, `streamrl.actors.endpoint_transport`)
whose api_key is the episode's credential (`streamrl.actors.credentials`: only the agent started for an episode may
call for it; episode ids carry a random part). Meanwhile this thread, the actor's, serves the endpoint: the requests
of concurrent episodes are batched into one generate call (waiting for the episodes still thinking while their
requests keep coming, at most `endpoint.batch_window_s` after the last), so the engine is only ever used from the
actor's thread and every turn of a call is sampled with the weights of one version.

Token in, token out (`streamrl.models.conversation`): an episode holds the ids it was given and sampled. Its
first request opens it (the chat template's rendering of the messages, or the completion prompt's ids); each
later request must extend what is held: new chat messages after those held are rendered and appended as the
environment's tokens (the model's own replies are kept as sampled, never re-tokenised from the text the agent
sends back; a rendering that disagrees counts as template drift, as for `task.environment`), and a completion
prompt must start with the held ids or their text. Each answer carries the completion's token ids
(`choices[0].token_ids`, the prompt's in `prompt_token_ids`) and, when asked (`logprobs`), their log-probs
(`return_tokens_as_token_ids` names the tokens `token_id:N`, as vLLM does). Every model turn is recorded (its
prompt ids, completion ids, log-probs, policy version; `endpoint.record_turns` writes them to the run directory).

A sample is the episode's ids after its group's common prompt, the model's tokens unmasked. The agent's return is
the reward (a dict: rewards by name, summed), put on the task's levels by the runtime's one rule, then shaped.
Failures are counted as reward failures by reason and logged: an agent that raised (`raised`), ran past
`task.agent_timeout_s` (`timeout`: abandoned, since Python cannot stop a thread; its later requests get 404) or
raised because a model call timed out (`timeout` too), returned None (`none`: could not score,
`reward_health.NONE_RULE`) or no number (`bad_return`, `non_finite`, `out_of_scale`) or never called the model
(`no_model_call`). A failed episode is unscored (its group's scored mean, as any unscored sample); a group with an
episode that sampled nothing, or none scored, is not sent (`groups_unscored`). An agent failing on most of its last
`task.reward_fail_window` episodes is broken, not flaky: `UserCodeFailure` stops the run. Requests the endpoint
refuses (no valid credential, malformed) never reach an episode, so they never count against the agent (counted
apart: `endpoint_refused/<code>`).

A request may ask for `n` choices (the episode goes on with the one the agent sends back), declare `tools` (the
reply is read by the task's tool parser into OpenAI `tool_calls`) or `stream` (`streamrl.actors.replies`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import secrets
import threading
import time
from pathlib import Path

import msgspec

from streamrl.config import Config
from streamrl.actors import agent_returns, endpoint_transport, replies
from streamrl.actors.endpoint import Endpoint, Request
from streamrl.actors.replies import Choice
from streamrl.actors.episodes import Episode, EpisodeRunner, EpisodeStats
from streamrl.actors.rollout import RolloutStats, fill_unscored
from streamrl.models.conversation import Conversation, Renderer
from streamrl.models.sampling import capped
from streamrl.tasks.base import optional
from streamrl.tasks.data_errors import data_error
from streamrl.tasks.environments import row_of
from streamrl.tasks.reward_health import FailureWindow, timed_out
from streamrl.tasks.tool_calls import parser_for

log = logging.getLogger("streamrl.actor")


class Turn(msgspec.Struct):
    """One model call of an episode: what the engine was given and what it sampled."""

    episode: str
    turn: int
    version: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    choice: int = 0
    """Which of the request's n choices (the episode goes on with the one the agent sends back; 0 by default)."""


class _Episode(Episode):
    def __init__(self, episode_id: str, group: int, row: dict):
        super().__init__(group)
        self.id, self.row = episode_id, row
        self.sampled: list[Turn] = []  # every model call, choices apart
        self.thread = None  # its agent's thread (a Future on the endpoint's loop: an async agent)
        self.value, self.error = None, None
        self.returned = False
        self.failure: str | None = None  # the reward-failure reason, if any
        self.tools: list[dict] | None = None  # the tools its first chat request declared
        self.choices: list[Choice] = []  # the last turn's (n > 1: the agent may go on with any)
        self.held_before = self.held_messages = 0  # what the episode held before the last turn's reply


class AgentEpisodes(EpisodeRunner):
    """rollout "agent": `make_groups(prompts, version)` plays G episodes per prompt of the task's `agent_fn`."""

    def __init__(self, cfg: Config, index: int, backend, tokenizer, reward, actor_id: str, end_ids: list[int]):
        super().__init__(cfg, backend, tokenizer, reward, actor_id, end_ids)
        t, e = cfg.task, cfg.endpoint
        self.fn = optional(reward.task, "agent_fn")
        if self.fn is None:
            raise ValueError(f"task {type(reward.task).__name__}: rollout 'agent' needs its agent_fn(client, row)")
        # An agent failing on most of its recent episodes is broken, not flaky: the run stops naming it.
        self.name, self.kind = t.agent or getattr(self.fn, "__name__", "agent"), getattr(self.fn, "kind", "agent")
        self.health = FailureWindow(t.reward_fail_window, t.reward_fail_threshold, self.kind)
        self.workers, self.timeout_s = t.agent_workers, t.agent_timeout_s
        self.is_async = inspect.iscoroutinefunction(self.fn)  # `async def` agents get an openai.AsyncOpenAI
        self.window_s = e.batch_window_s
        self.renderer = Renderer(tokenizer, *self.template)
        self.parser = parser_for(t.tool_parser, self.renderer.chat)
        self.endpoint = Endpoint(e.host, e.port + index if e.port else 0, e.request_timeout_s, actor_id,
                                 e.read_timeout_s)
        self.live: dict[str, _Episode] = {}
        self.record = Path(cfg.run_path) / "agent_turns" / f"{actor_id}.jsonl" if e.record_turns else None
        self.turns_log: list[Turn] = []
        """Every turn of the last call (tests and the record read it)."""
        self._client = None
        # httpx logs every request at INFO: thousands of lines a minute in the actor's log.
        for name in ("httpx", "httpx2"):  # openai 3 sends through httpx2
            logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger(name).level))

    def _client_for(self, episode_id: str):
        """An openai.OpenAI for one episode: one connection pool for all (a client is costly to make), each copy
        sending its episode's credential as its api_key (and its id)."""
        if self._client is None:
            import openai  # the agent's client: `pip install streamrl[agents]`

            # In process: the endpoint's own app and checks, without loopback HTTP (endpoint_transport).
            if self.is_async:
                http, make = endpoint_transport.async_http_client(openai, self.endpoint.app), openai.AsyncOpenAI
            else:
                http = endpoint_transport.http_client(openai, self.endpoint.app, self.endpoint.loop, self.timeout_s)
                make = openai.OpenAI
            self._client = make(base_url=self.endpoint.url, api_key="streamrl", max_retries=0, timeout=self.timeout_s,
                                http_client=http)
        return self._client.with_options(api_key=self.endpoint.keys.issue(episode_id),
                                         default_headers={"X-Episode-Id": episode_id})

    def close(self) -> None:
        self.endpoint.close()
        if self._client is not None and not self.is_async:  # an async one on ASGITransport holds nothing to release
            self._client.close()

    def _open(self, prompts: list, stats: EpisodeStats, done: RolloutStats) -> list[_Episode]:
        nonce = secrets.token_hex(6)  # ids nobody outside can list: <actor>-<random>-<group>-<sample>
        return [_Episode(f"{self.actor_id}-{nonce}-{g}-{i}", g, row_of(p))
                for g, p in enumerate(prompts) for i in range(self.group_size)]

    def _settle(self, mine: list[_Episode], done: RolloutStats) -> bool:
        """Each episode scored (its failure counted; a broken agent stops the run). A failed episode is unscored:
        it takes its group's scored mean, as a reward function's failed sample does (rollout.fill_unscored), since
        the agent's code failed, not the model's reply. A group with an episode that sampled nothing, or with none
        scored, is not sent: it leaves no sample to train."""
        for e in mine:
            self._score(e, done)
            if e.failure == "bad_data":  # the row's fault, not the agent's: never in the agent's window
                continue
            if e.failure is not None:
                self.failures[e.failure] += 1
            self.health.record(self.name, e.failure, self.failures)
            self.bad_rows.good()
        if self._bad_data(mine, done):
            return False
        for e, r in zip(mine, fill_unscored([e.reward if e.scored else None for e in mine])):
            e.reward = r
        return all(e.sampled for e in mine) and any(e.scored for e in mine)

    def _finish(self, episodes: list[_Episode], stats: EpisodeStats) -> None:
        if take := getattr(self.fn, "take_errors", None):  # verifiers: rollouts it ended errored (scored by it)
            stats.truncated.update(take())
        stats.endpoint_refused = self.endpoint.take_refused()
        self.turns_log = [t for e in episodes for t in e.sampled]
        if self.record is not None:
            self.record.parent.mkdir(parents=True, exist_ok=True)
            with self.record.open("ab") as f:
                f.writelines(msgspec.json.encode(t) + b"\n" for t in self.turns_log)

    def _play(self, episodes: list[_Episode], version: int, stats: EpisodeStats) -> None:
        """Every episode to its end: agents on their threads, their model calls served here in batches."""
        waiting, running = list(episodes), []
        while waiting or running:
            while waiting and len(running) < self.workers:
                running.append(self._start(waiting.pop(0)))
            batch = self._gather(running)
            if batch:
                self._serve(batch, version, stats)
            now, still = time.perf_counter(), []
            for e in running:
                if e.returned:
                    e.ended = now
                elif now - e.started > self.timeout_s:
                    e.ended, e.failure = now, "timeout"
                    if self.is_async:  # a coroutine can be stopped, unlike a thread
                        e.thread.cancel()
                    stats.truncated["agent_timeout"] = stats.truncated.get("agent_timeout", 0) + 1
                    log.warning("%s: agent episode %s ran past task.agent_timeout_s=%gs: abandoned, counted",
                                self.actor_id, e.id, self.timeout_s)
                else:
                    still.append(e)
                    continue
                self.live.pop(e.id, None)  # its later requests are answered 404
            running = still

    def _start(self, e: _Episode) -> _Episode:
        client = self._client_for(e.id)
        row = e.row.derived(e.row)  # the agent's own copy; a key it lacks is noted on e.row (data_errors)

        def run() -> None:
            try:
                e.value = self.fn(client, row)
            except BaseException as err:  # the user's bug: counted and logged with where it came from
                e.error = err
            finally:
                e.returned = True
                self.endpoint.wake()

        async def run_async() -> None:
            try:
                e.value = await self.fn(client, row)
            except BaseException as err:  # as run's (a timed-out episode's cancellation too)
                e.error = err
            finally:
                e.returned = True
                self.endpoint.wake()

        self.live[e.id] = e
        e.started = time.perf_counter()
        if self.is_async:  # a coroutine on the endpoint's own loop: no thread an episode (it must not block)
            e.thread = asyncio.run_coroutine_threadsafe(run_async(), self.endpoint.loop)
        else:
            e.thread = threading.Thread(target=run, name=f"{e.id}-agent", daemon=True)
            e.thread.start()
        return e

    def _gather(self, running: list[_Episode]) -> list[Request]:
        """The requests queued now, and those of episodes still thinking while they keep coming: the window
        (batch_window_s) runs from the last request, not the first, so requests that trickle in one by one (each
        agent's client has its work to do between turns, its threads taking turns) make one generate call, and
        an episode slower than that (a tool, a long think) costs the batch one window. Once every running episode
        has asked, nothing is waited for."""
        first = self.endpoint.take(0.05)
        if first is None:
            return []
        batch, last = [first], time.perf_counter()
        while sum(not e.returned for e in running) > len(batch) and (
                left := last + self.window_s - time.perf_counter()) > 0:
            if (r := self.endpoint.take(left)) is not None:
                batch.append(r)
                last = time.perf_counter()
        while (r := self.endpoint.take(0)) is not None:
            batch.append(r)
        return batch

    def _serve(self, batch: list[Request], version: int, stats: EpisodeStats) -> None:
        asks = []
        for r in batch:
            e = self.live.get(r.episode_id)
            if e is None:
                r.fail(404, f"episode {r.episode_id!r} is not in flight on {self.actor_id} (ended, timed out, or "
                            "not one of this actor's)", "unknown_episode")
            elif any(a[1] is e for a in asks):
                r.fail(409, f"episode {e.id!r}: one model call at a time (its turns are one sequence)", "busy")
            else:
                try:
                    asks.append((r, e, self._prompt(r, e)))
                except ValueError as err:
                    r.fail(400, f"episode {e.id!r}: {err}", "bad_prompt")
        for r, e, room in [a for a in asks if a[2] <= 0]:
            r.fail(400, f"episode {e.id!r}: no room left under the sequence cap ({len(e.conv.ids)} ids held, "
                        f"model.max_seq_len or the model's context {self.seq_cap})", "context_full")
        asks = [a for a in asks if a[2] > 0]
        if not asks:
            return
        # n > 1: the prompt n times in the batch, each its own sample of the same weights.
        drawn = iter(self.backend.generate([e.conv.ids for r, e, _ in asks for _ in range(r.body.get("n") or 1)], 1))
        for r, e, room in asks:
            prompt_ids, e.choices = list(e.conv.ids), []
            for k in range(r.body.get("n") or 1):
                c = capped(next(drawn)[0], room)
                tokens, logprobs = list(c.tokens), list(c.logprobs)
                body = tokens[:-1] if tokens and tokens[-1] in self.end_ids else tokens
                e.choices.append(Choice(tokens, logprobs, self.renderer.decode(body, skip_special_tokens=True),
                                        c.finish_reason))
                e.sampled.append(Turn(e.id, e.turns, version, prompt_ids, tokens, logprobs, k))
            e.held_before, e.held_messages, e.turns = len(prompt_ids), len(e.conv.messages), e.turns + 1
            self._hold(e, 0)
            r.answer(200, replies.payload(r.kind, r.body, f"{e.id}-{e.turns - 1}", prompt_ids, e.choices,
                                          version, lambda t: self.renderer.decode([t]), e.tools, self.parser))

    def _hold(self, e: _Episode, k: int) -> None:
        """The episode goes on with choice k of its last turn (the one held before is dropped)."""
        e.conv.cut(e.held_before)
        del e.conv.messages[e.held_messages:]
        c = e.choices[k]
        e.conv.add_reply(c.tokens, c.logprobs, self.end_ids)
        e.finish = c.finish

    def _pick(self, e: _Episode, fits) -> None:
        """n > 1: the episode goes on with the first choice of its last turn that `fits` the request (the one held,
        choice 0, when it fits or none does)."""
        if len(e.choices) < 2 or fits(0):
            return
        if (k := next((k for k in range(1, len(e.choices)) if fits(k)), None)) is not None:
            self._hold(e, k)

    def _prompt(self, r: Request, e: _Episode) -> int:
        """Opens or extends the episode's held ids with the request's prompt; returns the room for the reply."""
        body = r.body
        if r.kind == "chat":
            messages = [{**m, "content": _text(m.get("content"))} for m in body["messages"]]
            if e.conv is None:
                e.tools = body.get("tools") or None
                renderer = Renderer(self.tokenizer, *self.template, tools=e.tools) if e.tools else self.renderer
                e.conv = Conversation(renderer, messages)
            else:
                held = len(e.conv.messages)
                if e.choices and len(messages) >= held:  # which choice the agent went on with: its text or calls
                    sent, calls = messages[held - 1]["content"], messages[held - 1].get("tool_calls") or []
                    ids = [str(c.get("id", "")) for c in calls if isinstance(c, dict)]
                    self._pick(e, lambda k: e.choices[k].text == sent or any(
                        i.startswith(f"call-{e.id}-{e.turns - 1}-{k}-") for i in ids))
                if len(messages) <= held or any(m["role"] != h["role"] for m, h in zip(messages, e.conv.messages)):
                    raise ValueError(f"messages must extend the episode's conversation ({held} messages held, their "
                                     f"roles {[h['role'] for h in e.conv.messages]}); start a new episode instead")
                names = _tool_names(messages, held)
                e.conv.add_messages(messages[held:], names)
                e.tool_calls.update(f"{n}/answered" for n in names)  # the agent ran the call: its outcome is its own
        else:
            prompt = body["prompt"]
            ids = prompt if isinstance(prompt, list) else self.renderer.ids(prompt)
            if e.conv is None:
                e.conv = Conversation.of_ids(self.renderer, ids)
            else:
                before = e.conv.ids[:e.held_before]
                self._pick(e, lambda k: _starts(e.conv.r, before + e.choices[k].tokens, ids, prompt))
            if not e.conv.extend_to(ids, prompt if isinstance(prompt, str) else None):
                raise ValueError(f"the prompt does not start with the episode's {len(e.conv.ids)} held ids (nor "
                                 "their text): a turn extends the previous prompt and completion")
        asked = body.get("max_completion_tokens", body.get("max_tokens")) or self.max_new_tokens
        return min(asked, self.room(e.conv))

    def _score(self, e: _Episode, done: RolloutStats) -> None:
        """The episode's shaped reward, or its failure counted (and the lowest level where it sampled tokens)."""
        value, why = None, e.failure
        if why is None and (bad := data_error(e.row, e.error)):
            why = "bad_data"
            self.bad_rows.bad(e.row, bad, str(self.name))
        elif why is None and e.error is not None:
            why = "timeout" if timed_out(e.error) else "raised"
            log.warning("%s: agent %s %s in episode %s (unscored, counted): %s: %s", self.actor_id,
                        getattr(self.fn, "__name__", self.fn), "timed out" if why == "timeout" else "raised", e.id,
                        type(e.error).__name__, e.error)
        elif why is None and not e.sampled:
            why = "no_model_call"
            log.warning("%s: agent %s returned without calling the model in episode %s (counted; its group is "
                        "not sent)", self.actor_id, getattr(self.fn, "__name__", self.fn), e.id)
        elif why is None:
            value, why = agent_returns.reward_of(e.value)
            if why is None and (value := self.on_level(value)) is None:
                why = "out_of_scale"
            if why is not None:
                log.warning("%s: agent episode %s returned %r: %s (unscored, counted); return a number on "
                            "the scale %s or a dict of numbers", self.actor_id, e.id, e.value, why, self.levels)
        if why is not None and why != "bad_data":  # bad data: counted by _bad_data, named by bad_rows
            setattr(done, f"reward_{why}", getattr(done, f"reward_{why}") + 1)
            self.health.note(self.name, why, agent_returns.detail(e, why, self.levels, self.timeout_s))
        e.failure, e.scored = why, why is None
        e.reward = None if value is None else self.reward.shape(value)


def _starts(renderer: Renderer, held: list[int], ids: list[int], prompt) -> bool:
    """Whether a completion prompt (its ids, or its text) starts with `held`."""
    return ids[:len(held)] == held or (isinstance(prompt, str) and prompt.startswith(renderer.decode(held)))


def _tool_names(messages: list[dict], held: int) -> list[str]:
    """The tool of each tool result after the first `held` messages: its message's name, else that of the call it
    answers (its tool_call_id among the assistant messages' tool_calls); "?" for neither. Cut to 64 characters."""
    calls = {str(c.get("id")): c["function"].get("name") for m in messages if m.get("role") == "assistant"
             for c in (m.get("tool_calls") or []) if isinstance(c, dict) and isinstance(c.get("function"), dict)}
    return [str(m.get("name") or calls.get(str(m.get("tool_call_id"))) or "?")[:64]
            for m in messages[held:] if m.get("role") == "tool"]


def _text(content) -> str:
    """A message's content as text (a list of parts: its text parts joined)."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)
