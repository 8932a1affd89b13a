"""The actor's multi-turn episode runner: tools, errors, timeouts, truncation, token in / token out, overlap.

A scripted policy stands in for the model where a test needs to know what it will say (it answers through the
real word-level tokenizer, with the Backend protocol's Completion); the last test runs the real tiny model.
"""

from __future__ import annotations

import random
import re
import textwrap
import threading
import time
from pathlib import Path

import msgspec
import pytest
from streamrl import config
from streamrl.actors import backends
from streamrl.actors.environment_episodes import EnvironmentEpisodes
from streamrl.models import model as model_lib
from streamrl.models.sampling import Completion
from streamrl.tasks import rewards
from streamrl.tasks.base import Prompt
from streamrl.tasks.reward_health import UserCodeFailure

REPO = Path(__file__).resolve().parents[3]


class Scripted:
    """A policy: reply(prompt text) → reply text; returns it as sampled tokens ending with <eos>."""

    def __init__(self, tokenizer, reply):
        self.tok, self.reply, self.calls = tokenizer, reply, []

    def generate(self, prompts, n, between_steps=None):
        self.calls.append(len(prompts))
        out = []
        for ids in prompts:
            toks = self.tok.encode(self.reply(self.tok.decode(ids))) + [self.tok.eos_token_id]
            out.append([Completion(tokens=toks, logprobs=[-0.5] * len(toks), finish_reason="stop")
                        for _ in range(n)])
        return out


def _setup(overrides=(), reply=None):
    cfg = config.load("tiny-tools.yaml", ["actors.group_size=2", *overrides])
    reward = rewards.build(cfg)
    model, tok = model_lib.build(cfg, [*reward.task.vocabulary, "error:"])
    backend = Scripted(tok, reply) if reply else backends.build("hf", cfg, model, tok)
    return cfg, reward, tok, backend


def first_frame(tb: str) -> str:
    """The file of a formatted traceback's first frame."""
    return re.search(r'File "([^"]+)"', tb)[1]


def _prompts(task, k=2, seed=0):
    rng = random.Random(seed)
    return [task.sample(rng) for _ in range(k)]


def _last_word(text: str) -> str:
    return text.split()[-1]


def lookup_then_answer(text: str) -> str:
    """Call lookup with the prompt's key, then answer with the tool's result."""
    words = text.split()
    return f"lookup {words[1]}" if len(words) == 2 else f"answer {words[-1]}"


def test_an_episode_calls_the_tool_reads_its_result_and_is_rewarded():
    cfg, reward, tok, backend = _setup(reply=lookup_then_answer)
    runner = EnvironmentEpisodes(cfg, backend, tok, reward, "actor-0", [tok.eos_token_id])
    prompts = _prompts(reward.task)
    groups, stats, done = runner.make_groups(prompts, version=3)
    runner.close()
    assert [g.rewards for g in groups] == [[1.0, 1.0], [1.0, 1.0]]
    assert stats.tool_calls == {"lookup/ok": 4} and stats.turns == [2, 2, 2, 2] and stats.truncated == {}
    g, p = groups[0], prompts[0]
    # Token in, token out: prompt = tools line + key; completion = model turn, tool result, model turn.
    assert tok.decode(list(g.prompt_tokens)) == f"lookup {p.columns['key']}"
    first = g.completion_tokens[:g.samples[0].num_tokens]
    assert tok.decode(list(first)) == f"lookup {p.columns['key']} <eos> {p.columns['symbol']} answer {p.columns['symbol']} <eos>"
    mask = g.model_token_mask[:g.samples[0].num_tokens]
    assert mask.tolist() == [True, True, True, False, True, True, True]
    lp = g.behaviour_logprobs[:g.samples[0].num_tokens]
    assert lp.tolist() == [-0.5, -0.5, -0.5, 0.0, -0.5, -0.5, -0.5]
    assert g.policy_version == 3 and stats.template_drift == 0


def test_an_episodes_turns_reach_the_samples_log_in_order_with_their_roles_tools_and_texts(tmp_path):
    from streamrl.comm import codec
    from streamrl.learner.samples import records

    env = tmp_path / "twice_env.py"
    env.write_text(textwrap.dedent("""
        from streamrl.tasks.lookup import LookupEnv

        class Twice(LookupEnv):  # no tools: the environment answers the first reply, the second ends it
            with_tool = False

            def step(self, reply):
                self.said = getattr(self, "said", 0) + 1
                return ([{"role": "user", "content": "answer"}], None, False) if self.said == 1 else ([], 1.0, True)
    """))
    for overrides, reply, roles in (
            ((), lookup_then_answer, [("model", ()), ("tool", ("lookup",)), ("model", ())]),
            ((f"task.environment={env}:Twice",), lambda t: "a", [("model", ()), ("environment", ()), ("model", ())])):
        cfg, reward, tok, backend = _setup(overrides, reply=reply)
        runner = EnvironmentEpisodes(cfg, backend, tok, reward, "actor-0", [tok.eos_token_id])
        groups, _, _ = runner.make_groups(_prompts(reward.task, 1), 0)
        runner.close()
        g = codec.decode_groups([bytes(memoryview(f).cast("B")) for f in codec.encode_groups(groups)])[0]  # as received
        spans = g.sample_turns(0)
        assert [(t.role, t.tools) for t in spans] == roles and sum(t.tokens for t in spans) == g.samples[0].num_tokens
        # the model's turns are exactly the tokens it sampled
        mask = g.sample_model_mask(0).tolist()
        assert mask == [t.role == "model" for t in spans for _ in range(t.tokens)]
        decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731  (as the learner decodes)
        record = records([g], 0, 0, cfg, decode, 8)[0]
        turns = record["conversation"]
        assert [t["role"] for t in turns] == [r for r, _ in roles] and record["turns"] == 2
        assert " ".join(t["text"] for t in turns).split() == record["completion"].split()
    assert turns[1]["text"] == "answer" and turns[0]["text"] == turns[2]["text"] == "a", turns


def test_a_raising_tool_becomes_an_error_message_and_is_counted():
    cfg, reward, tok, backend = _setup(reply=lambda t: "lookup a" if len(t.split()) == 2 else "a")  # a: no key
    runner = EnvironmentEpisodes(cfg, backend, tok, reward, "actor-0", [tok.eos_token_id])
    groups, stats, done = runner.make_groups(_prompts(reward.task, 1), 0)
    runner.close()
    assert stats.tool_calls == {"lookup/raised": 2}
    text = tok.decode(list(groups[0].completion_tokens[:groups[0].samples[0].num_tokens]))
    assert "error:" in text  # the model saw the error (unknown words of it are <unk> to the word tokenizer)
    assert groups[0].rewards == [0.0, 0.0]


def test_a_tool_raising_on_most_calls_stops_the_actor_naming_it_with_its_traceback(tmp_path):
    env = tmp_path / "down_env.py"
    env.write_text(textwrap.dedent("""
        from streamrl.tasks.lookup import LookupEnv

        class Down(LookupEnv):
            def __init__(self, row):
                super().__init__(row)
                self.tools = [self.lookup]

            def lookup(self, key: str) -> str:
                raise ConnectionError("the symbol service is down")
    """))
    cfg, reward, tok, backend = _setup([f"task.environment={env}:Down", "task.reward_fail_window=4"],
                                       reply=lookup_then_answer)
    runner = EnvironmentEpisodes(cfg, backend, tok, reward, "actor-0", [tok.eos_token_id])
    with pytest.raises(UserCodeFailure, match=r"tool lookup failed on 4 of its last 4 calls \(raised\): "
                                              r"ConnectionError: the symbol service is down") as e:
        runner.make_groups(_prompts(reward.task, 2), 0)
    runner.close()
    assert e.value.kind == "tool" and e.value.counts == {"tool_raised": 4}
    assert first_frame(e.value.traceback) == str(env) and "in lookup" in e.value.traceback  # from the user's frame down


def test_a_tool_refusing_the_models_input_is_never_judged_broken():
    # LookupEnv's lookup raises KeyError for a key it does not have: the model's mistake, told to it, counted
    cfg, reward, tok, backend = _setup(["task.reward_fail_window=2"],
                                       reply=lambda t: "lookup a" if len(t.split()) == 2 else "a")  # a: no key
    runner = EnvironmentEpisodes(cfg, backend, tok, reward, "actor-0", [tok.eos_token_id])
    _, stats, done = runner.make_groups(_prompts(reward.task, 3), 0)
    runner.close()
    assert stats.tool_calls == {"lookup/raised": 6} and runner.failures == {}


def test_a_raising_environment_leaves_its_episodes_unscored_and_most_of_a_window_stops_the_actor(tmp_path):
    env = tmp_path / "bad_env.py"
    env.write_text(textwrap.dedent("""
        from streamrl.tasks.lookup import LookupEnv

        class Bad(LookupEnv):
            def step(self, reply):
                raise ValueError("no state " + reply)

        class Half(LookupEnv):
            made = 0

            def __init__(self, row):
                super().__init__(row)
                Half.made += 1
                self.bad = Half.made % 2 == 0

            def step(self, reply):
                if self.bad:
                    raise ValueError("every other one")
                return [], 1.0, True
    """))
    cfg, reward, tok, backend = _setup([f"task.environment={env}:Half"], reply=lambda t: "a")
    runner = EnvironmentEpisodes(cfg, backend, tok, reward, "actor-0", [tok.eos_token_id])
    groups, stats, done = runner.make_groups(_prompts(reward.task, 1), 0)  # 1 of its window of 50: it goes on
    runner.close()
    # the failed episode takes its group's scored mean (not the lowest level: the model's reply did not fail)
    assert groups[0].scored == [True, False] and groups[0].rewards == [1.0, 1.0] and stats.step_raised == 1
    cfg, reward, tok, backend = _setup([f"task.environment={env}:Bad"], reply=lambda t: "a")
    runner = EnvironmentEpisodes(cfg, backend, tok, reward, "actor-0", [tok.eos_token_id])
    groups, stats, done = runner.make_groups(_prompts(reward.task, 1), 0)
    runner.close()
    assert groups == [] and done.groups_unscored == 1 and stats.step_raised == 2  # nothing scored: not sent
    cfg, reward, tok, backend = _setup([f"task.environment={env}:Bad", "task.reward_fail_window=4"],
                                       reply=lambda t: "a")
    runner = EnvironmentEpisodes(cfg, backend, tok, reward, "actor-0", [tok.eos_token_id])
    with pytest.raises(UserCodeFailure, match=r"environment .*bad_env.py:Bad failed on 4 of its last 4 episodes "
                                              r"\(raised\): ValueError: no state a") as got:
        runner.make_groups(_prompts(reward.task, 2), 0)
    runner.close()
    assert first_frame(got.value.traceback) == str(env), got.value.traceback  # the user's step, not the runner's


def test_a_skyrl_envs_failure_shows_the_envs_own_frames_not_the_adapters(tmp_path):
    """A SkyRL-Gym env is played through streamrl's adapter (streamrl.tasks.skyrl_adapter): the traceback the run
    stops with starts in the env's own step, and its episodes end unscored (docs/guides/skyrl-gym.md)."""
    pytest.importorskip("skyrl_gym")
    example = REPO / "examples" / "skyrl-gym-copy"
    env = tmp_path / "broken_env.py"
    env.write_text(textwrap.dedent("""
        from skyrl_gym.envs.base_text_env import BaseTextEnv

        class Broken(BaseTextEnv):
            def __init__(self, env_config=None, extras={}):
                super().__init__()
                self.extras = extras

            def step(self, action):
                return {**self.extras}["missing"]  # its own bug: read from a copy, not the row
    """))
    cfg = config.load(str(example / "config.yaml"), [
        f"task.data={example / 'train.jsonl'}", f"task.environment={env}:Broken", "actors.group_size=2",
        "task.reward_fail_window=4", f"run_dir={tmp_path}"])
    reward = rewards.build(cfg)
    _model, tok = model_lib.build(cfg, reward.task.vocabulary)
    runner = EnvironmentEpisodes(cfg, Scripted(tok, lambda t: "a b"), tok, reward, "actor-0", [tok.eos_token_id])
    groups, stats, done = runner.make_groups(_prompts(reward.task, 1), 0)  # 2 of its window of 4: it goes on
    assert groups == [] and done.groups_unscored == 1 and stats.step_raised == 2  # unscored, not the lowest level
    with pytest.raises(UserCodeFailure, match=r"KeyError: 'missing'") as got:
        runner.make_groups(_prompts(reward.task, 1), 0)
    runner.close()
    assert first_frame(got.value.traceback) == str(env), got.value.traceback
    assert "skyrl_adapter" not in got.value.traceback and "environment_episodes" not in got.value.traceback


def test_an_environment_that_could_not_score_leaves_its_episode_unscored_counted_and_mostly_none_stops(tmp_path):
    # A done step with reward None scored the lowest level silently before (could not score: reward_health.NONE_RULE).
    env = tmp_path / "none_env.py"
    env.write_text(textwrap.dedent("""
        from streamrl.tasks.lookup import LookupEnv

        class NoneOnWrong(LookupEnv):
            made = 0

            def __init__(self, row):
                super().__init__(row)
                NoneOnWrong.made += 1
                self.scores = NoneOnWrong.made % 2 == 1

            def step(self, reply):
                return [], (1.0 if self.scores else None), True

        class AlwaysNone(LookupEnv):
            def step(self, reply):
                return [], None, True
    """))
    cfg, reward, tok, backend = _setup([f"task.environment={env}:NoneOnWrong"], reply=lambda t: "a")
    runner = EnvironmentEpisodes(cfg, backend, tok, reward, "actor-0", [tok.eos_token_id])
    groups, stats, done = runner.make_groups(_prompts(reward.task, 1), 0)
    runner.close()
    assert groups[0].scored == [True, False] and groups[0].rewards == [1.0, 1.0], groups[0]  # the group's mean
    assert done.reward_none == 1 and runner.failures["environment_none"] == 1
    cfg, reward, tok, backend = _setup([f"task.environment={env}:AlwaysNone", "task.reward_fail_window=4"],
                                       reply=lambda t: "a")
    runner = EnvironmentEpisodes(cfg, backend, tok, reward, "actor-0", [tok.eos_token_id])
    with pytest.raises(UserCodeFailure, match=r"environment .*none_env.py:AlwaysNone failed on 4 of its last 4 "
                                              r"episodes \(none\): AlwaysNone.step returned reward None"):
        runner.make_groups(_prompts(reward.task, 4), 0)
    runner.close()


def _play_row_reader(env, cls: str, columns: dict | None = None):
    """One prompt of the lookup task (its row given `columns` too) played by `cls` of the file `env`, whose episodes
    read their row as self.r; (groups, stats, done, runner)."""
    cfg, reward, tok, backend = _setup([f"task.environment={env}:{cls}"], reply=lambda t: "a")
    prompts = [msgspec.structs.replace(p, columns={**p.columns, **(columns or {})}) for p in _prompts(reward.task, 1)]
    runner = EnvironmentEpisodes(cfg, backend, tok, reward, "actor-0", [tok.eos_token_id])
    groups, stats, done = runner.make_groups(prompts, 0)
    runner.close()
    return groups, stats, done, runner


ROW_READER = """
    from streamrl.tasks.lookup import LookupEnv

    class RowReader(LookupEnv):
        def __init__(self, row):
            super().__init__(row)
            self.r = row
"""


def test_an_environment_reading_a_column_its_row_lacks_makes_the_row_bad_data_not_an_environment_failure(tmp_path):
    env = tmp_path / "reads_env.py"
    env.write_text(textwrap.dedent(ROW_READER) + textwrap.dedent("""
        class ReadsAnswer(RowReader):
            def step(self, reply):
                return [], float(self.r["answer"] == reply), True

        class OpensWithAnswer(ReadsAnswer):
            def reset(self):
                return [{"role": "user", "content": self.r["answer"]}]
    """))
    for cls in ("ReadsAnswer", "OpensWithAnswer"):  # read in step, or while the episode opens
        groups, stats, done, runner = _play_row_reader(env, cls)
        assert groups == [] and done.reward_bad_data == 2, (cls, done)
        assert stats.step_raised == 0 and not runner.failures, runner.failures  # not the environment's failure
        assert runner.bad_rows.counts == {"missing column 'answer'": 2}


def test_an_environment_reading_past_the_end_of_a_list_column_makes_the_row_bad_data(tmp_path):
    env = tmp_path / "index_env.py"
    env.write_text(textwrap.dedent(ROW_READER) + textwrap.dedent("""
        class ReadsFifthHint(RowReader):
            def step(self, reply):
                try:
                    self.r["hints"][9]  # caught and handled: never the row's fault on its own
                except IndexError:
                    pass
                return [], float(self.r["hints"][4] == reply), True

        class OwnIndexError(ReadsFifthHint):
            def step(self, reply):
                self.r["hints"][0]
                return [][0]  # the code's own IndexError: its failure, not the row's
    """))
    groups, stats, done, runner = _play_row_reader(env, "ReadsFifthHint", {"hints": ["a"]})
    assert groups == [] and done.reward_bad_data == 2, done
    assert stats.step_raised == 0 and not runner.failures, runner.failures
    assert list(runner.bad_rows.counts) == ["column 'hints' has 1 item(s); index 4 was read"]
    _, stats, done, _ = _play_row_reader(env, "OwnIndexError", {"hints": ["a"]})
    assert done.reward_bad_data == 0 and stats.step_raised == 2


def test_unknown_tools_and_unfit_arguments_are_errors_the_model_sees():
    cfg, reward, tok, backend = _setup(reply=lambda t: "lookup" if len(t.split()) == 2 else "a")
    runner = EnvironmentEpisodes(cfg, backend, tok, reward, "actor-0", [tok.eos_token_id])
    _, stats, done = runner.make_groups(_prompts(reward.task, 1), 0)
    runner.close()
    assert stats.tool_calls == {"lookup/bad_call": 2}


def test_episodes_end_truncated_at_max_turns_and_at_the_sequence_cap():
    cfg, reward, tok, backend = _setup(["task.max_turns=3"], reply=lambda t: f"lookup {t.split()[1]}")
    runner = EnvironmentEpisodes(cfg, backend, tok, reward, "actor-0", [tok.eos_token_id])
    groups, stats, done = runner.make_groups(_prompts(reward.task, 1), 0)
    assert stats.truncated == {"max_turns": 2} and stats.turns == [3, 3]
    assert [s.finish_reason for s in groups[0].samples] == ["length", "length"]
    assert groups[0].rewards == [0.0, 0.0]  # no reward at truncation: the lowest level
    runner.close()
    cfg, reward, tok, backend = _setup(["task.max_turns=5", "model.max_seq_len=8"],
                                       reply=lambda t: f"lookup {t.split()[1]}")
    runner = EnvironmentEpisodes(cfg, backend, tok, reward, "actor-0", [tok.eos_token_id])
    groups, stats, done = runner.make_groups(_prompts(reward.task, 1), 0)
    runner.close()
    assert stats.truncated == {"max_seq_len": 2}
    assert all(len(groups[0].prompt_tokens) + s.num_tokens <= 8 for s in groups[0].samples)


def test_a_tool_past_its_timeout_is_abandoned_and_the_episode_goes_on(tmp_path):
    env = tmp_path / "slow_env.py"
    env.write_text(textwrap.dedent("""
        import time
        from streamrl.tasks.lookup import LookupEnv

        class Slow(LookupEnv):
            def __init__(self, row):
                super().__init__(row)
                self.tools = [self.lookup]

            def lookup(self, key: str) -> str:
                time.sleep(1.0)
                return self.symbol
    """))
    cfg, reward, tok, backend = _setup([f"task.environment={env}:Slow", "task.tool_timeout_s=0.1"],
                                       reply=lookup_then_answer)
    runner = EnvironmentEpisodes(cfg, backend, tok, reward, "actor-0", [tok.eos_token_id])
    t0 = time.perf_counter()
    groups, stats, done = runner.make_groups(_prompts(reward.task, 1), 0)
    waited = time.perf_counter() - t0
    runner.close()
    assert stats.tool_calls == {"lookup/timeout": 2}
    assert waited < 1.0  # the runner did not wait for the abandoned calls
    assert groups[0].rewards == [0.0, 0.0]


def test_tools_run_while_other_episodes_generate(tmp_path):
    """A slow tool overlaps generation: while one episode's tool call runs, the runner samples other episodes'
    turns (seen from inside the tool and the policy), and calls run side by side on the pool."""
    running, seen = [0], {"most": 0, "generated_during_tool": 0}
    lock = threading.Lock()

    class Probe(Scripted):
        def generate(self, prompts, n, between_steps=None):
            with lock:
                seen["generated_during_tool"] += running[0] > 0
            return super().generate(prompts, n, between_steps)

    def lookup(key: str) -> str:
        with lock:
            running[0] += 1
            seen["most"] = max(seen["most"], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return "a"

    cfg, reward, tok, _ = _setup(["actors.group_size=4"])
    calls = iter(range(10_000))

    class Staggered:  # episodes call the tool at different turns, so some wait on it while others generate
        def __init__(self, row):
            self.n, self.tools, self.turn = next(calls) % 3, [lookup], 0

        def reset(self):
            return [{"role": "user", "content": "k1"}]

        def step(self, reply):
            self.turn += 1
            return [{"role": "user", "content": "k1"}], 1.0, self.turn > self.n

    import streamrl.tasks.environments as envs
    backend = Probe(tok, lambda t: "lookup k1" if t.split()[-1] == "k1" else "a")
    real_load = envs.load
    envs.load = lambda ref: Staggered
    try:
        runner = EnvironmentEpisodes(cfg, backend, tok, reward, "actor-0", [tok.eos_token_id])
    finally:
        envs.load = real_load
    runner.make_groups([Prompt(id=f"p{i}", text="k1") for i in range(4)], 0)
    runner.close()
    assert seen["most"] > 1 and seen["generated_during_tool"] > 0


def test_the_tiny_model_plays_lookup_episodes_token_in_token_out():
    cfg, reward, tok, backend = _setup(["actors.group_size=4"])
    runner = EnvironmentEpisodes(cfg, backend, tok, reward, "actor-0", backend.eos_ids)
    groups, stats, done = runner.make_groups(_prompts(reward.task, 8, seed=1), 0)
    runner.close()
    assert len(groups) == 8 and stats.episodes == 32
    for g in groups:
        assert len(g.model_token_mask) == len(g.completion_tokens) == len(g.behaviour_logprobs)
        assert (g.behaviour_logprobs[~g.model_token_mask] == 0).all() and (g.behaviour_logprobs[g.model_token_mask] < 0).all()
        assert set(g.rewards) <= {0.0, 0.25, 0.5, 1.0}
    assert 32 <= sum(stats.turns) <= 64 and stats.template_drift == 0


def test_episode_metrics_reach_prometheus():
    from prometheus_client import generate_latest

    from streamrl.actors.episodes import EpisodeStats
    from streamrl.telemetry import actor_metrics, prometheus_metrics

    registry = prometheus_metrics.new_registry()
    m = actor_metrics.ActorMetrics(registry, "r", "actor-0")
    m.observe_episodes(EpisodeStats(episodes=3, turns=[1, 2, 4], tool_calls={"lookup/ok": 2, "(unknown)/unknown_tool": 1},
                                    tool_s=0.5, episode_s=2.0, truncated={"max_turns": 1}, template_drift=2))
    text = generate_latest(registry).decode()
    assert 'streamrl_actor_tool_calls_total{actor="actor-0",outcome="ok",run="r",tool="lookup"} 2.0' in text
    assert 'tool="(unknown)"' in text and 'streamrl_actor_episode_turns_count{actor="actor-0",run="r"} 3.0' in text
    assert 'streamrl_actor_episodes_truncated_total{actor="actor-0",reason="max_turns",run="r"} 1.0' in text
    assert 'streamrl_actor_tool_seconds_total{actor="actor-0",run="r"} 0.5' in text
    assert 'streamrl_actor_episodes_template_drift_total{actor="actor-0",run="r"} 2.0' in text


def test_a_dataset_task_feeds_its_rows_to_an_environment_without_reward_functions(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "k1", "key": "k1", "symbol": "b"}\n{"prompt": "k2", "key": "k2", "symbol": "c"}\n')
    cfg = config.load("tiny-tools.yaml", ["task.name=dataset", f"task.data={data}", "task.reward_levels=[0, 1]",
                                          "task.options={}", "task.vocabulary=[lookup, answer]", "actors.group_size=2"])
    reward = rewards.build(cfg)
    model, tok = model_lib.build(cfg, reward.task.vocabulary)
    runner = EnvironmentEpisodes(cfg, Scripted(tok, lookup_then_answer), tok, reward, "actor-0", [tok.eos_token_id])
    groups, stats, done = runner.make_groups([reward.task.sample(random.Random(0)) for _ in range(2)], 0)
    runner.close()
    reward.task.functions.close()
    assert stats.tool_calls == {"lookup/ok": 4} and [g.rewards for g in groups] == [[1.0, 1.0], [1.0, 1.0]]
