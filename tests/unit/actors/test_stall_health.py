"""An actor's /healthz says stalled, with the reason, while one generate call makes no progress (a reward call that
hangs) for monitoring.actor_stall_s, and ok again once it ends; waiting between calls (the staleness bound, new
weights) is never a stall (issue 37: hung rewards stalled the actors while /healthz answered 200)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

from prometheus_client import CollectorRegistry

from streamrl import config as config_lib
from streamrl.actors.backends import Completion
from streamrl.actors.generation import Generation
from streamrl.models.word_tokenizer import WordTokenizer
from streamrl.tasks import rewards
from streamrl.telemetry import actor_metrics, prometheus_metrics
from streamrl.telemetry.exporter import Exporter, Health

REWARD = '''
import threading
RELEASE = threading.Event()

def hangs(prompts, completions, answer, **kwargs):
    RELEASE.wait(120)
    return [1.0] * len(completions)
'''


class Echo:
    def __init__(self):
        self.calls = 0

    def generate(self, prompts, n):
        self.calls += 1
        return [[Completion([p[-1]], [-0.1], "stop") for _ in range(n)] for p in prompts]


def healthz(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_generate_call_that_never_ends_makes_healthz_stalled_with_the_reason_and_waiting_does_not(tmp_path):
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"prompt": f"x {w}", "answer": w}) + "\n"
                                                 for w in ("red", "blue")))
    (tmp_path / "hang.py").write_text(REWARD)
    cfg = config_lib.load(None, ["task.name=dataset", f"task.data={tmp_path / 'rows.jsonl'}",
                                 f"task.reward={tmp_path / 'hang.py'}:hangs", "task.reward_levels=[0, 1]",
                                 "advantage.r_min_correct=1", "task.reward_overlap=false", "task.reward_timeout_s=300",
                                 "actors.group_size=2"])
    reward = rewards.build(cfg)
    tok = WordTokenizer(reward.task.vocabulary)
    metrics = actor_metrics.ActorMetrics(prometheus_metrics.new_registry(), "t", "actor-0")
    # A beat counts for a minute (a loaded machine answers well within it); the call's limit is 0.3 s.
    health = Health("actor-0", healthy_within_s=60.0, stall_after_s=0.3)
    exporter = Exporter(CollectorRegistry(), health, "127.0.0.1", 0)
    generate = Generation(cfg, 0, 0, Echo(), tok, reward, metrics, health=health)
    release = __import__("sys").modules[reward.task.functions.fns[0].__module__].RELEASE
    try:
        time.sleep(0.5)  # idle past the limit, as an actor the learner holds back waits: not a stall
        status, body = healthz(exporter.port)
        assert status == 200 and body["status"] == "ok", body
        call = threading.Thread(target=generate, args=(2, 0, None))
        call.start()
        deadline, status, body = time.monotonic() + 60, 200, {}
        while status == 200 and time.monotonic() < deadline:
            time.sleep(0.1)
            status, body = healthz(exporter.port)
        assert status == 503 and body["status"] == "stalled", body
        assert "a generate call has made no progress" in body["reason"] and "actor_stall_s" in body["reason"], body
        release.set()
        call.join(60)
        assert not call.is_alive()
        status, body = healthz(exporter.port)
        assert status == 200 and body["status"] == "ok" and "reason" not in body, body
    finally:
        release.set()
        exporter.close()
        reward.close()
