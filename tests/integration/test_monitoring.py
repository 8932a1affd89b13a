"""Monitoring against a real Prometheus: a learner and three actors are scraped every second while
they train; one actor is killed and restarted. Every dashboard query and every alert signal must
return data, the exposition must pass promtool, and the panels must render."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml
import zmq
from procs import REPO, free_ports, send_raw, spawn
from prom import MONITORING, Prometheus, scrape_config, signals

sys.path.insert(0, str(MONITORING))
import dashboard  # noqa: E402

pytestmark = pytest.mark.slow
ACTORS = 3
RULES = yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"][0]["rules"]


def consecutive_free_ports(n: int) -> int:
    """First of n consecutive free ports (actor i serves metrics on base + i)."""
    for _ in range(50):
        base = free_ports(1)[0]
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no run of free ports")


class Stack:
    """Prometheus + learner + actors, all real processes on loopback."""

    def __init__(self, tmp, prometheus_bin: str):
        group, weights, requests, self.learner_port, prom_port = free_ports(5)
        self.actor_port = consecutive_free_ports(ACTORS)
        self.tmp, self.started = tmp, time.time()
        self.group_addr = f"tcp://127.0.0.1:{group}"
        # A learner slowed to about 10 steps/s, and so its throttled actors: the stack trains through all the tests
        # of this module, and at full speed four processes took the CPU the renderer and Prometheus need (10 min
        # for the panels on one core).
        self.args = [str(REPO / "configs" / "tiny.yaml"), "name=mon", f"run_dir={tmp / 'runs'}", "steps=100000",
                     "learner.slow_step_s=0.1", f"actors.num={ACTORS}", f"transport.group_port={group}", f"transport.weights_port={weights}",
                     f"transport.weights_request_port={requests}", f"monitoring.learner_port={self.learner_port}",
                     f"monitoring.actor_port={self.actor_port}"]
        self.prom = Prometheus(prometheus_bin, scrape_config(f"127.0.0.1:{self.learner_port}",
                                             [f"127.0.0.1:{self.actor_port + i}" for i in range(ACTORS)]),
                               tmp / "prometheus", prom_port)
        self.learner = spawn(["learner", *self.args], tmp / "learner.log")
        self.actors = [self.start_actor(i) for i in range(ACTORS)]

    def start_actor(self, i: int) -> subprocess.Popen:
        return spawn(["actor", *self.args, "--index", str(i)], self.tmp / f"actor-{i}-{time.monotonic_ns()}.log")

    def actor_instance(self, i: int) -> str:
        return f"127.0.0.1:{self.actor_port + i}"

    def stop(self) -> None:
        if self.learner.poll() is None:
            self.learner.send_signal(signal.SIGTERM)  # it finishes the step, checkpoints, tells actors to exit
            self.learner.wait(timeout=60)
        for p in self.actors:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()

    def close(self) -> None:
        for p in [self.learner, *self.actors]:
            if p.poll() is None:
                p.kill()
        self.prom.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, prometheus_bin):
    st = Stack(tmp_path_factory.mktemp("monitoring"), prometheus_bin)
    try:
        q = st.prom
        q.wait_for("streamrl_learner_steps_total > 20", timeout=240, what="the learner to take 20 steps")
        for i in range(ACTORS):
            q.wait_for(f'streamrl_actor_groups_sent_total{{actor="actor-{i}"}} > 0', timeout=60,
                       what=f"actor-{i} to be scraped sending groups")
        ctx = zmq.Context()
        send_raw(ctx, zmq.PUSH, st.group_addr, [[b"\xc1 not a streamrl message"]])
        ctx.term()
        q.wait_for("streamrl_messages_rejected_total > 0", timeout=30, what="the garbage message to be counted")
        # An outage: actor-1 dies without a word, then comes back under the same index.
        first_life = q.value(f'process_start_time_seconds{{instance="{st.actor_instance(1)}"}}')
        st.actors[1].kill()
        st.actors[1].wait()
        q.wait_for(f'up{{instance="{st.actor_instance(1)}"}} == 0', timeout=30, what="actor-1 to be seen down")
        st.actor_down_alert = q.wait_for('ALERTS{alertname="StreamrlActorDown"}', timeout=30,
                                         what="StreamrlActorDown to go pending")
        st.killed_at = time.time()
        st.actors[1] = st.start_actor(1)
        q.wait_for(f'up{{instance="{st.actor_instance(1)}"}} == 1 and on(instance) '
                   f'process_start_time_seconds{{instance="{st.actor_instance(1)}"}} != {first_life}',
                   timeout=120, what="the restarted actor-1 to be scraped")
        q.wait_for('streamrl_actor_groups_sent_total{actor="actor-1"} > 0', timeout=60,
                   what="the restarted actor-1 to send groups")
        # A few scrapes of the second life, so rates over the restart have points on both sides: the window
        # (as long as the time since the kill) never reaches back to the first life.
        # The window grows with each poll: one fixed at the first poll can be shorter than four scrape intervals
        # (a quick restart), and no wait fills it.
        deadline = time.monotonic() + 60
        while not q.query(f'count_over_time(streamrl_actor_groups_generated_total{{actor="actor-1"}}'
                          f'[{int(time.time() - st.killed_at) + 1}s]) >= 4'):
            assert time.monotonic() < deadline, "timed out after 60s waiting for four scrapes of the restarted actor-1"
            time.sleep(0.5)
        yield st
    finally:
        st.close()


def _fill(expr: str) -> str:
    return expr.replace("$__rate_interval", "1m").replace('"$run"', '"mon"').replace('"$actor"', '".*"')


def _promql(query: str) -> str:
    """Grafana's label_values(expr, label) is a variable query, not PromQL: query expr."""
    if query.startswith("label_values("):
        return query[len("label_values("):].rsplit(",", 1)[0]
    return query


# Series labelled by tool exist only in a run whose task has an environment (this stack's run is single-turn);
# tests/unit/actors/test_episodes.py reads them back from a multi-turn actor's registry.
MULTI_TURN_ONLY = {"Tool calls"}


def test_every_dashboard_query_returns_data_from_a_real_run(stack):
    empty = [(title, q) for title, q in dashboard.queries(dashboard.build())
             if title not in MULTI_TURN_ONLY and not stack.prom.query(_promql(_fill(q)))]
    assert not empty, "dashboard queries with no data:\n" + "\n".join(f"  {t}: {q}" for t, q in empty)


def test_every_alert_signal_returns_data_and_every_rule_evaluates(stack):
    empty = []
    for rule in RULES:
        stack.prom.query(rule["expr"])  # valid PromQL, evaluates (firing or not)
        empty += [(rule["alert"], s) for s in signals(rule["expr"]) if not stack.prom.query(s)]
    assert not empty, "alert signals with no data:\n" + "\n".join(f"  {a}: {s}" for a, s in empty)
    loaded = [r for g in stack.prom.api("rules")["groups"] for r in g["rules"]]
    assert sorted(r["name"] for r in loaded) == sorted(r["alert"] for r in RULES)
    assert all(r["health"] == "ok" for r in loaded), [(r["name"], r.get("lastError")) for r in loaded]


def test_a_killed_actor_sets_off_the_actor_down_alert(stack):
    labels = [a["metric"] for a in stack.actor_down_alert]
    assert [(m["instance"], m["alertstate"]) for m in labels] == [(stack.actor_instance(1), "pending")]


def test_every_actor_process_has_its_own_series(stack):
    series = stack.prom.query("streamrl_actor_tokens_generated_total")
    by_actor = {s["metric"]["actor"]: s["metric"]["instance"] for s in series}
    assert by_actor == {f"actor-{i}": stack.actor_instance(i) for i in range(ACTORS)}
    assert all(s["metric"]["run"] == "mon" for s in series)


def test_a_restarted_actor_keeps_one_series_whose_rate_never_goes_negative(stack):
    q = stack.prom
    window = f"{int(time.time() - stack.started) + 5}s"
    sel = 'streamrl_actor_groups_generated_total{actor="actor-1"}'
    assert len(q.api("series", **{"match[]": sel, "start": stack.started})) == 1  # same labels before and after
    assert q.value(f"resets({sel}[{window}])") >= 1  # Prometheus saw the counter restart at 0...
    assert q.value(f"min_over_time(rate({sel}[5s])[{window}:1s])") >= 0  # ...and reads it as a reset, not a drop
    assert q.value(f"increase({sel}[{window}])") > q.value(sel)  # counts from both lives of the process


def test_the_exposition_passes_promtool_check_metrics(stack, promtool_bin):
    for port in (stack.learner_port, stack.actor_port):
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        assert b"streamrl_" in text
        check = subprocess.run([promtool_bin, "check", "metrics"], input=text, capture_output=True)
        assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()


def test_healthz_reports_live_progress(stack):
    body = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{stack.learner_port}/healthz", timeout=10).read())
    assert body["status"] == "ok" and body["role"] == "learner" and body["learner_version"] > 20
    actor = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{stack.actor_port}/healthz", timeout=10).read())
    assert actor["status"] == "ok" and actor["role"] == "actor-0"


def test_the_dashboard_panels_render_from_prometheus(stack):
    sys.path.insert(0, str(MONITORING))
    import render_panels

    out = stack.tmp / "panels.png"
    drawn = render_panels.render(stack.prom.url, stack.started, time.time(), out, run="mon", scrape_interval_s=1)
    panels = [p for p in dashboard.build()["panels"] if p["type"] != "row" and p["title"] not in MULTI_TURN_ONLY]
    assert drawn == len(panels)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000


def test_the_learner_reports_what_serving_metrics_cost(stack):
    stack.stop()
    summary = json.loads((stack.tmp / "runs" / "mon" / "summary.json").read_text())
    assert summary["metrics_scrapes"] > 10  # scraped every second by the Prometheus above
    assert summary["metrics_scrape_cpu_s"] > 0 and summary["metrics_s"] > 0
    assert 0 < summary["metrics_overhead_fraction"] < 1
    print(f"metrics overhead: {summary['metrics_overhead_fraction']:.4f} of step time over {summary['steps']} steps")
