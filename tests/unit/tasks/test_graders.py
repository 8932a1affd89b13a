"""The rubric grader against a real HTTP server on loopback speaking the OpenAI chat-completions API
(tests/fakes/openai_server.py: scripted replies, no model), through the real `openai` client."""

from __future__ import annotations

import re
import threading
import time

import pytest

pytest.importorskip("openai")

from fakes.openai_server import ChatServer

from streamrl.config import ConfigError, GraderConfig, load
from streamrl.tasks import graders


def _cfg(server: ChatServer, **kw) -> GraderConfig:
    kw.setdefault("retries", 0)
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("timeout_s", 5.0)
    return GraderConfig(base_url=server.base_url, model="judge", **kw)


def _score_in_completion(req: dict) -> str:
    """The judge's 'opinion': the number written after SCORE= in the graded text."""
    return re.search(r"SCORE=(\S+)", req["messages"][-1]["content"]).group(1)


@pytest.fixture
def server():
    s = ChatServer(_score_in_completion).start()
    yield s
    s.stop()


@pytest.mark.parametrize("text,scale,want", [
    ("7", 10, 7), (" 7\n", 10, 7), ("7.", 10, 7), ("Score: 3", 5, 3), ("score=3", 5, 3), ("4/5", 5, 4),
    ("<think>hmm, maybe 2</think>\n5", 5, 5), ("10", 10, 10), ("1", 10, 1),
    ("0", 10, None), ("11", 10, None), ("4/10", 5, None), ("7 out of 10", 10, None), ("seven", 10, None),
    ("7 because it is good", 10, None), ("", 10, None), ("3.5", 5, None), ("-2", 5, None),
])
def test_answers_are_parsed_strictly(text, scale, want):
    assert graders.parse_score(text, scale) == want


def test_scores_map_onto_levels_and_columns_reach_the_template(server):
    cfg = _cfg(server, scale=5, template="Q: {prompt}\nA: {completion}\nref={reference}")
    prompts = ["2+2?", [{"role": "system", "content": "be terse"}, {"role": "user", "content": "3+3?"}], "x", "y"]
    completions = ["SCORE=1", [{"role": "assistant", "content": "SCORE=5"}], "SCORE=3", "SCORE=4"]
    got = graders.grade(cfg, prompts, completions, reference=["4", "6", "r3", "r4"])
    assert got == [0.0, 1.0, 0.5, 0.75]
    sent = [r["messages"][-1]["content"] for r in server.requests]
    assert "Q: system: be terse\nuser: 3+3?\nA: SCORE=5\nref=6" in sent
    assert all(r["model"] == "judge" and r["structured_outputs"] == {"choice": ["1", "2", "3", "4", "5"]}
               for r in server.requests)


def test_an_answer_off_the_scale_is_none_and_counted_unparseable(server):
    cfg = _cfg(server, scale=5, constrain="none")
    g = graders.Grader(cfg)
    try:
        assert g(["p"] * 4, ["SCORE=9", "SCORE=good", "SCORE=2", "SCORE=0"]) == [None, None, 0.25, None]
        assert g.failures == {"unparseable": 3} and g.scored == 1
        assert all("structured_outputs" not in r for r in server.requests)
    finally:
        g.close()


def test_a_server_refusing_structured_outputs_is_asked_again_without_them():
    s = ChatServer(_score_in_completion, accept_structured_outputs=False).start()
    g = graders.Grader(_cfg(s, scale=5, constrain="auto"))
    try:
        assert g(["p", "p"], ["SCORE=2", "SCORE=5"]) == [0.25, 1.0]
        assert not g.failures and g.constrain is False
        assert any("structured_outputs" in r for r in s.requests)
        assert "structured_outputs" not in s.requests[-1]
    finally:
        g.close()
        s.stop()


def test_constrain_choice_never_drops_the_constraint():
    s = ChatServer(_score_in_completion, accept_structured_outputs=False).start()
    g = graders.Grader(_cfg(s, scale=5, constrain="choice"))
    try:
        assert g(["p"], ["SCORE=2"]) == [None]
        assert g.failures == {"http_400": 1} and g.constrain is True
    finally:
        g.close()
        s.stop()


def test_concurrency_is_bounded_across_concurrent_calls():
    s = ChatServer(_score_in_completion, delay_s=0.1).start()
    g = graders.Grader(_cfg(s, concurrency=3))
    try:
        out: list = []
        callers = [threading.Thread(target=lambda: out.append(g(["p"] * 4, ["SCORE=10"] * 4))) for _ in range(3)]
        [t.start() for t in callers]
        [t.join() for t in callers]
        assert out == [[1.0] * 4] * 3
        assert s.max_in_flight == 3
    finally:
        g.close()
        s.stop()


def test_a_slow_server_times_out_is_retried_with_backoff_and_counted():
    s = ChatServer(_score_in_completion, delay_s=1.0).start()
    g = graders.Grader(_cfg(s, timeout_s=0.2, retries=2, backoff_s=0.1))
    try:
        t0 = time.monotonic()
        assert g(["p"], ["SCORE=3"]) == [None]
        took = time.monotonic() - t0
        assert g.failures == {"timeout": 1} and g.requests == 3
        assert took >= 3 * 0.2 + 0.1 + 0.2  # three timeouts and the backoffs 0.1 s, 0.2 s between them
    finally:
        g.close()
        s.stop()


def test_a_5xx_is_retried_and_a_server_that_recovers_scores(server):
    g = graders.Grader(_cfg(server, retries=3, backoff_s=0.2))
    try:
        server.status, server.status_times = 503, 2  # two 503s, then it recovers (a timer raced a loaded machine)
        assert g(["p"], ["SCORE=10"]) == [1.0]
        assert not g.failures and g.requests == 3
        server.status = 404
        assert g(["p"], ["SCORE=10"]) == [None]  # not retried: a 4xx other than 429 will not change
        assert g.failures == {"http_404": 1}
    finally:
        g.close()


def test_a_stopped_server_gives_counted_connection_failures_and_is_used_again_when_back(server):
    g = graders.Grader(_cfg(server, retries=1, backoff_s=0.05))
    try:
        assert g(["p"] * 3, ["SCORE=4"] * 3) == [1 / 3] * 3
        server.stop()
        assert g(["p"] * 3, ["SCORE=4"] * 3) == [None] * 3
        assert g.failures == {"connection": 3}
        server.start()  # same port, same grader object: no restart of the grader
        assert g(["p"] * 3, ["SCORE=7"] * 3) == [2 / 3] * 3
        assert g.failures == {"connection": 3} and g.scored == 6
    finally:
        g.close()


def test_rubric_uses_the_configured_grader_and_refuses_without_one(server, monkeypatch):
    monkeypatch.setattr(graders, "_CONFIGURED", [])
    with pytest.raises(RuntimeError, match="no grader configured"):
        graders.rubric(["p"], ["SCORE=1"])
    graders.configure(_cfg(server, scale=3))
    assert graders.rubric(["p", "q"], ["SCORE=2", "SCORE=3"]) == [0.5, 1.0]


def test_failures_are_summed_over_every_grader_of_the_process(monkeypatch):
    monkeypatch.setattr(graders, "_GRADERS", {})
    a, b = ChatServer(_score_in_completion).start(), ChatServer(_score_in_completion).start()
    try:
        graders.grade(_cfg(a, scale=5, constrain="none"), ["p", "p"], ["SCORE=9", "SCORE=2"])
        graders.grade(_cfg(b, scale=3, constrain="none"), ["p"], ["SCORE=x"])
        b.stop()
        graders.grade(_cfg(b, scale=3), ["p"], ["SCORE=1"])
        assert graders.failure_counts() == {"unparseable": 2, "connection": 1}
    finally:
        [g.close() for g in graders._GRADERS.values()]
        a.stop()
        b.stop()


def test_a_template_missing_a_column_names_it():
    with pytest.raises(ValueError, match=r"names \{reference\}, which this row lacks"):
        graders.Grader(GraderConfig(template="{completion} vs {reference}")).render("p", "c", {})


def test_an_api_key_comes_from_the_named_environment_variable(server, monkeypatch):
    monkeypatch.setenv("STREAMRL_TEST_GRADER_KEY", "sekrit")
    g = graders.Grader(_cfg(server, api_key_env="STREAMRL_TEST_GRADER_KEY"))
    try:
        assert g.client.api_key == "sekrit"
    finally:
        g.close()
    monkeypatch.delenv("STREAMRL_TEST_GRADER_KEY")
    with pytest.raises(ValueError, match="STREAMRL_TEST_GRADER_KEY.*unset"):
        _ = graders.Grader(_cfg(server, api_key_env="STREAMRL_TEST_GRADER_KEY")).client


@pytest.mark.parametrize("template,match", [
    ("no completion here {prompt}", "must contain {completion}"),
    ("{completion} {", "not a format string"),
    ("{completion} {row[0]}", "not plain names"),
])
def test_the_config_refuses_a_bad_template(template, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        GraderConfig(template=template)


def test_the_grader_section_loads_from_overrides(tmp_path):
    cfg = load(None, ["grader.base_url=http://10.0.0.1:9000/v1", "grader.scale=5", "grader.concurrency=2"])
    assert (cfg.grader.base_url, cfg.grader.scale, cfg.grader.concurrency) == ("http://10.0.0.1:9000/v1", 5, 2)
    with pytest.raises(ConfigError, match="scale"):
        load(None, ["grader.scale=1"])


def test_a_grader_failing_on_most_samples_stops_the_run_like_a_broken_reward_and_a_working_one_does_not(server):
    from streamrl.tasks.reward_functions import Call, RewardFunctions
    from streamrl.tasks.reward_health import UserCodeFailure

    graders.configure(_cfg(server, scale=3))
    fns = RewardFunctions(["streamrl.tasks.graders:rubric"], fail_window=4, workers=2)
    try:
        outs = fns.score([Call("p", ["SCORE=2", "SCORE=3"], [[], []], {}) for _ in range(3)])
        assert [o.scores for o in outs] == [[0.5, 1.0]] * 3  # 6 graded samples: nothing to judge
        server.stop()  # the grader's server goes away for good: every sample fails past its retries
        with pytest.raises(UserCodeFailure, match=r"grader streamrl.tasks.graders:rubric failed on 3 of its last 4 "
                                                  r"samples \(grader_connection\)") as e:
            fns.score([Call("p", ["SCORE=2"] * 2, [[], []], {}) for _ in range(2)])
        assert e.value.kind == "grader" and "judge at http://127.0.0.1" in e.value.error, e.value.error
        assert e.value.counts["none"] >= 3  # still counted as today: samples the grader gave None
    finally:
        fns.close()
