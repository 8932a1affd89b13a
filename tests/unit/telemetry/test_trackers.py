"""Experiment trackers (monitoring.report_to): what each one wrote, read back with its own reader, from the records
RunLog writes to metrics.jsonl; a tracker that fails never stops the learner; none is imported unless named."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from streamrl import config
from streamrl.learner.runlog import RunLog
from streamrl.registry import Plugin
from streamrl.run import preflight
from streamrl.telemetry import trackers
from streamrl.telemetry.trackers import TRACKERS, RunInfo, Tracker, Trackers

REWARDS = [0.25, 0.5, 0.125, 0.75]
# step 2's logged samples, as learner.samples.table makes them of samples.jsonl's records
SAMPLES = (["step", "prompt", "completion", "reward", "details"],
           [[2, "add 1 2", "add 1 2 | 3", 1.0, '{"turns": 2}'], [2, "add 1 2", "x", 0.0, '{"turns": 1}']])


def _record(step: int) -> dict:
    return {"step": step, "learner_version": step + 1, "reward_mean": REWARDS[step], "step_s": 0.1,
            "lag_hist": {"0": 6, "1": 2}, "filter": "none", "ratios": [1.0, 2.0], "kl": None, "strict": True,
            "eval/pass@1": 0.5}


def _run(tmp_path: Path, names: list[str], **kwargs) -> tuple[RunLog, dict]:
    """RunLog of a 4-step run reporting to `names`, the way the learner's Session opens it; returns the summary."""
    cfg = config.load(None, [f"run_dir={tmp_path / 'runs'}", "name=tr", "steps=4",
                             f"monitoring.report_to=[{','.join(names)}]"])
    log = RunLog(cfg)
    log.open(resumed_step=0)
    log.trackers = Trackers(names, RunInfo("tr", cfg.run_path, "streamrl-test", config.to_dict(cfg)), **kwargs)
    for step in range(4):
        if step == 2:
            log.trackers.samples(step, SAMPLES)
        log.step(_record(step))
    summary = log.summary({"status": "finished"}, reward_range=(0.0, 1.0))
    log.close()
    return log, summary


def test_report_to_is_empty_by_default_and_refuses_an_unknown_tracker_listing_the_valid_ones():
    assert config.load(None).monitoring.report_to == []
    with pytest.raises(config.ConfigError, match=r"monitoring\.report_to=\['tensorbord'\]: unknown tracker "
                                                 r"'tensorbord'; valid: mlflow, tensorboard, trackio, wandb"):
        config.load(None, ["monitoring.report_to=[tensorbord]"])
    with pytest.raises(config.ConfigError, match="names a tracker twice"):
        config.load(None, ["monitoring.report_to=[wandb,wandb]"])


def test_the_registry_refuses_a_second_tracker_of_the_same_name():
    with pytest.raises(ValueError, match="tracker 'wandb' is already registered"):
        TRACKERS.register("wandb")(Tracker(module="wandb", extra="wandb", open=_Flaky))


def test_a_missing_library_is_one_preflight_line_naming_the_tracker_and_its_extra(tmp_path, monkeypatch):
    real = trackers.importlib.util.find_spec
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda m: None if m == "wandb" else real(m))
    cfg = config.load(None, [f"run_dir={tmp_path}", "monitoring.report_to=[tensorboard,wandb]",
                             "transport.group_port=0", "transport.weights_port=0",
                             "transport.weights_request_port=0", "transport.weight_sync_port=0"])
    errors, _ = preflight.problems(cfg, "run")
    assert errors == [("monitoring.report_to: tracker 'wandb' needs the 'wandb' package, which is not installed; "
                       "pip install 'streamrl[wandb]' (or drop wandb from report_to)")]
    assert preflight.problems(cfg, "actor")[0] == []  # actors report nothing: only the learner's leader does


def test_wandb_online_without_an_api_key_is_a_preflight_warning(tmp_path, monkeypatch):
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    (tmp_path / "netrc").write_text("machine example.org login user password secret\n")
    assert trackers.start_warnings(["wandb"]) == [
        "monitoring.report_to: wandb finds no API key for api.wandb.ai (WANDB_API_KEY, ~/.netrc); unless `wandb login` "
        "stored one elsewhere it will not start and the run goes on without it; WANDB_MODE=offline writes offline "
        "runs to sync later"]
    assert trackers.start_warnings(["tensorboard"]) == []
    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password 0123\n")
    assert trackers.start_warnings(["wandb"]) == []
    (tmp_path / "netrc").unlink()
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert trackers.start_warnings(["wandb"]) == []


def test_the_step_records_flatten_to_numbers_only():
    assert trackers.scalars(_record(1)) == {"learner_version": 2.0, "reward_mean": 0.5, "step_s": 0.1,
                                            "lag_hist/0": 6.0, "lag_hist/1": 2.0, "strict": 1.0,
                                            "eval/pass@1": 0.5}


def test_tensorboard_event_files_hold_every_step_the_config_and_the_summary(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, summary = _run(tmp_path, ["tensorboard"])
    acc = EventAccumulator(str(tmp_path / "runs" / "tr" / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars("reward_mean")
    assert [e.step for e in events] == [0, 1, 2, 3]
    assert [e.value for e in events] == pytest.approx(REWARDS)
    assert [e.value for e in acc.Scalars("lag_hist/1")] == [2.0] * 4
    assert len(acc.Scalars("eval/pass@1")) == 4
    assert acc.Scalars("summary/steps")[0].value == 4
    assert acc.Scalars("summary/reward_last_10pct")[0].value == pytest.approx(summary["reward_last_10pct"])
    assert "config/text_summary" in acc.Tags()["tensors"]
    assert any("_hparams_/session_start_info" in t for t in acc.summary_metadata)  # the config as hparams
    [text] = acc.Tensors("samples/text_summary")  # the samples as a markdown table, at their step
    table = text.tensor_proto.string_val[0].decode()
    assert text.step == 2 and "step|prompt|completion|reward|details" in table and "add 1 2 \\| 3" in table, table


def test_mlflow_file_store_holds_every_step_the_config_as_params_and_the_outcome(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path / 'mlruns'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    _run(tmp_path, ["mlflow"])
    client = MlflowClient(tracking_uri=f"file:{tmp_path / 'mlruns'}")
    [run] = client.search_runs([client.get_experiment_by_name("streamrl-test").experiment_id])
    history = client.get_metric_history(run.info.run_id, "reward_mean")
    assert sorted((m.step, m.value) for m in history) == list(enumerate(REWARDS))
    assert len(client.get_metric_history(run.info.run_id, "eval/pass_at_1")) == 4  # MLflow refuses '@' in names
    assert run.data.params["steps"] == "4" and run.data.params["monitoring.report_to"] == '["mlflow"]'
    assert run.data.params["model.path"] == "null"
    assert run.info.run_name == "tr" and run.info.status == "FINISHED"
    assert run.data.metrics["summary/steps"] == 4
    summary = json.loads(Path(client.download_artifacts(run.info.run_id, "summary.json", str(tmp_path))).read_text())
    assert summary["status"] == "finished" and summary["trackers"]["failures"] == {"mlflow": 0}
    artifact = client.download_artifacts(run.info.run_id, "samples/step-2.json", str(tmp_path))
    table = json.loads(Path(artifact).read_text())
    assert table == {"columns": SAMPLES[0], "data": SAMPLES[1]}


def _wandb_records(path: Path) -> list:
    """The records of a W&B offline run file (run-*.wandb): a ':W&B' header, then LevelDB log records (7-byte
    header: crc32, little-endian length, type 1 full / 2 first / 3 middle / 4 last) in 32 KiB blocks, each a
    `wandb_internal_pb2.Record`. wandb 0.31 reads these in its Go core only, so the test reads them itself."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B", data[:8]
    pos, out, pending = 7, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if length == 0 and kind == 0:  # zero padding
            pos += block - pos % block
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(pending)
            out.append(rec)
            pending = b""
    return out


def test_wandb_offline_run_file_holds_every_step_the_config_and_the_summary(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wb").mkdir()
    _run(tmp_path, ["wandb"])
    [path] = (tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb")
    records = _wandb_records(path)
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    kinds = [r.WhichOneof("record_type") for r in records]
    assert [h["_step"] for h in history] == [0, 1, 2, 3], (path.stat().st_size, kinds)
    assert [h["reward_mean"] for h in history] == pytest.approx(REWARDS)
    assert history[2]["samples/_type"] == "table-file" and history[2]["samples/nrows"] == 2  # a W&B table, at step 2
    written = json.loads((path.parent / "files" / history[2]["samples/path"]).read_text())
    assert written["columns"] == SAMPLES[0] and written["data"] == SAMPLES[1]
    assert not any(k.startswith("samples") for k in history[1])
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.project, run.display_name) == ("streamrl-test", "tr")
    config_items = {i.key: json.loads(i.value_json) for i in run.config.update}  # the run's config, as sent
    assert config_items["steps"] == 4 and config_items["model"]["path"] is None
    summary = {i.key: json.loads(i.value_json) for r in records if r.WhichOneof("record_type") == "summary"
               for i in r.summary.update}
    assert summary["status"] == "finished" and summary["steps"] == 4
    assert [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"] == [0]


def test_trackio_local_database_holds_every_step_and_the_config(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    pytest.importorskip("trackio")
    # trackio reads TRACKIO_DIR when imported: a fresh interpreter sees this test's folder.
    code = ("import sys; from streamrl.telemetry.trackers import RunInfo, Trackers; from pathlib import Path;"
            f"t = Trackers(['trackio'], RunInfo('tr', Path({str(tmp_path)!r}), 'streamrl-test', {{'steps': 4}}));"
            f"[t.log({{'step': s, 'reward_mean': r}}) for s, r in enumerate({REWARDS!r})];"
            "t.close({'status': 'finished'}); sys.exit(sum(t.failures.values()))")
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    read = ("from trackio.sqlite_storage import SQLiteStorage as S; import json;"
            "print(json.dumps([S.get_logs('streamrl-test', 'tr'), S.get_run_config('streamrl-test', 'tr')]))")
    proc = subprocess.run([sys.executable, "-c", read], check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    logs, cfg = json.loads(proc.stdout.splitlines()[-1])
    assert [(r["step"], r["reward_mean"]) for r in logs] == list(enumerate(REWARDS))
    assert cfg["steps"] == 4


class _Flaky:
    """A writer whose every call raises, standing for a tracker whose service went away mid-run."""

    def __init__(self, run):
        pass

    def log(self, metrics, step):
        raise ConnectionError("tracker service unreachable")

    def close(self, summary):
        raise ConnectionError("tracker service unreachable")


def test_a_tracker_that_raises_is_logged_once_counted_and_never_stops_the_others_or_metrics_jsonl(
        tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(TRACKERS._plugins, "wandb", Plugin(item=Tracker(module="wandb", extra="wandb", open=_Flaky),
                                                              capabilities={"api_key_needed"}))
    with caplog.at_level(logging.ERROR, logger="streamrl.trackers"):
        log, summary = _run(tmp_path, ["wandb", "tensorboard"])
    told = [r.getMessage() for r in caplog.records]
    assert len(told) == 1 and told[0].startswith("tracker wandb: log failed at step 0: ConnectionError: "
                                                 "tracker service unreachable (the run goes on")
    assert summary["trackers"]["failures"] == {"wandb": 4, "tensorboard": 0}  # 4 steps; close came after
    assert log.trackers.failures["wandb"] == 5
    lines = (tmp_path / "runs" / "tr" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["reward_mean"] for x in lines] == REWARDS
    assert list((tmp_path / "runs" / "tr" / "tensorboard").glob("events.out.tfevents.*"))
    assert json.loads((tmp_path / "runs" / "tr" / "summary.json").read_text())["status"] == "finished"


class _Hung:
    """A writer whose log never returns until released, standing for a tracker server that stopped answering."""

    entered = threading.Event()
    release = threading.Event()

    def __init__(self, run):
        pass

    def log(self, metrics, step):
        self.entered.set()
        self.release.wait()

    def close(self, summary):
        pass


def test_a_hung_tracker_never_holds_up_a_step_and_the_run_ends_without_it(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(TRACKERS._plugins, "wandb", Plugin(item=Tracker(module="wandb", extra="wandb", open=_Hung),
                                                              capabilities={"api_key_needed"}))
    t = Trackers(["wandb"], RunInfo("tr", tmp_path, "p"), max_pending=2, wait_s=0.2)
    try:
        with caplog.at_level(logging.ERROR, logger="streamrl.trackers"):
            t.log(_record(0))  # were a step to wait for the tracker, this would never return (pytest-timeout)
            assert _Hung.entered.wait(30)
            for step in (1, 2, 3):  # 1 and 2 wait in the queue; 3 finds it full
                t.log(_record(step))
            report = t.report()["trackers"]
            t.close({"status": "finished"})
        assert report["dropped"] == 1 and report["failures"] == {"wandb": 0}
        told = [r.getMessage() for r in caplog.records]
        assert told[0].startswith("trackers: 2 step records are waiting for the trackers (wandb); step 3 and")
        assert told[1].startswith("trackers: wandb did not finish within 0.2 s; the learner ends without them")
    finally:
        _Hung.release.set()
    t._thread.join(30)
    assert not t._thread.is_alive()


def test_a_tracker_that_cannot_start_is_left_out_and_the_run_goes_on(tmp_path, caplog):
    (tmp_path / "runs" / "tr").mkdir(parents=True)
    (tmp_path / "runs" / "tr" / "tensorboard").write_text("a file where the event folder should be")
    with caplog.at_level(logging.ERROR, logger="streamrl.trackers"):
        _, summary = _run(tmp_path, ["tensorboard"])
    assert [r.getMessage().split(":")[:2] for r in caplog.records] == [["tracker tensorboard", " could not start"]]
    assert summary["trackers"]["failures"] == {"tensorboard": 1} and summary["steps"] == 4


def test_a_run_whose_summary_was_never_written_still_closes_its_trackers_as_failed(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path / 'mlruns'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    cfg = config.load(None, [f"run_dir={tmp_path / 'runs'}", "name=tr"])
    log = RunLog(cfg)
    log.open(resumed_step=0)
    log.trackers = Trackers(["mlflow"], RunInfo("tr", cfg.run_path, "streamrl-test", config.to_dict(cfg)))
    log.step(_record(0))
    log.close()  # the learner died before its summary
    client = MlflowClient(tracking_uri=f"file:{tmp_path / 'mlruns'}")
    [run] = client.search_runs([client.get_experiment_by_name("streamrl-test").experiment_id])
    assert run.info.status == "FAILED"


def test_no_tracker_library_is_imported_unless_named(tmp_path):
    code = ("import sys; from streamrl import config; from streamrl.learner.runlog import RunLog;"
            "from streamrl.run import preflight;"
            f"cfg = config.load(None, ['run_dir={tmp_path}']); preflight.problems(cfg, 'check');"
            "log = RunLog(cfg); log.open(0); log.step({'step': 0, 'reward_mean': 0.5, 'step_s': 0.1});"
            "log.summary({}, (0.0, 1.0)); log.close();"
            "print([m for m in ('tensorboard', 'wandb', 'mlflow', 'trackio') if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
